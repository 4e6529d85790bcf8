"""Disaggregated serving measured: a prefill pool and a decode pool on a warm pool of ranks, and the check of
colocated against disaggregated on the same ranks and trace (Zhong et al. 2024, DistServe; Patel et al. 2024,
Splitwise).

``run_disaggregated`` serves a trace on two pools of any sizes the heads allow; a ``DisaggregatedRun`` is a
``ServingRun`` plus each request's K/V bytes per link, from the comm log and ``presets.kv_bytes_per_link``.
``run_disaggregation_check`` serves four configurations (``CONFIGURATIONS``): the colocated engine prefill-first
and with chunked prefill (``run_serving``, tensor parallelism over every rank), and the two pools, the K/V handed
over whole or layer by layer (half the ranks each). A fifth, colocated replicas (one engine per pool's worth of
ranks), is predicted only. ``DisaggregationCheck`` holds the runs, the predictions, SLO attainment and goodput
per objective, the interference (decode steps with and without prompt tokens), the hand-off's wait and the
verdicts (``lab.verdict``)"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from shardlib.core.checks import flag, whole_number
from shardlib.core.model import LlamaWeights
from shardlib.core.serving.disagg import disaggregated_on_rank
from shardlib.facts.hardware import Link
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.engine_drivers import ServingRun, check_serving, run_serving
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.engine import PredictedServing, simulate_serving
from shardlib.predict.serving.goodput import ServingObjective, goodput, request_metrics, slo_attainment
from shardlib.predict.serving.pools import simulate_colocated, simulate_pools
from shardlib.predict.serving.presets import kv_bytes_per_link
from shardlib.predict.shapes import tensor_parallel_problems


@dataclass(frozen=True)
class DisaggregatedRun(ServingRun):
    """A disaggregated run: the engine's figures, each pool's steps, and the K/V each request handed off
    (bytes measured and predicted, per link and in all, in how many messages); ``handoff_s``: seconds from a
    request's first token to its K/V in the decode cache (the decode pool's step in progress waited out)."""

    prefill_ranks: int = 1
    layerwise: bool = False
    kv_link_bytes_predicted: dict = field(default_factory=dict)  # id -> {(prefill, decode) index in its pool: bytes}

    prefill_steps = property(lambda self: self.got.values[0].steps)  # the prefill pool's leader's
    decode_steps = property(lambda self: self.got.values[self.prefill_ranks].steps)  # the decode pool's leader's
    handoff_s = property(lambda self: dict(self.got.values[self.prefill_ranks].handoff_s or {}))  # by request id

    @property
    def outputs(self) -> dict:
        """Request id -> (tokens, token times, preemptions): the first token from the prefill pool, the rest
        (the first included) from the decode pool."""
        out = dict(self.got.values[0].outputs)
        for rid, (tokens, times, n) in self.got.values[self.prefill_ranks].outputs.items():
            out[rid] = (tokens, times, out[rid][2] + n)
        return out

    def _kv_sends(self) -> dict:
        """Request id -> {link: its K/V messages' sizes}: each prefill rank's ``handoff`` sends, in order."""
        sends = {r.request_id: {} for r in self.requests}
        for rank, result in enumerate(self.got.values[:self.prefill_ranks]):
            records = [c for c in self.got.records("send", rank) if c.group == "handoff"]
            if [c.peer for c in records] != [peer for _, peer in result.kv_sent]:
                raise RuntimeError(f"rank {rank}'s comm log and K/V sends disagree: {records} vs {result.kv_sent}")
            for record, (i, peer) in zip(records, result.kv_sent):
                link = (rank, peer - self.prefill_ranks)
                sends[self.requests[i].request_id].setdefault(link, []).append(record.size_bytes)
        return sends

    kv_link_bytes_sent = property(lambda self: {rid: {link: sum(b) for link, b in links.items()}
                                                for rid, links in self._kv_sends().items()})
    kv_bytes_sent = property(lambda self: {rid: sum(b.values()) for rid, b in self.kv_link_bytes_sent.items()})
    kv_bytes_predicted = property(lambda self: {i: sum(b.values()) for i, b in self.kv_link_bytes_predicted.items()})
    kv_messages = property(lambda self: {rid: sum(map(len, b.values())) for rid, b in self._kv_sends().items()})


def check_split(world_size: int, prefill_ranks: int, model_config) -> int:
    """The decode pool's size, or a ValueError saying why ``prefill_ranks`` does not split the job: each pool
    splits the model over its own ranks (``tensor_parallel_problems``); the two sizes may differ."""
    whole_number(prefill_ranks, "prefill_ranks (a whole number of ranks: a pool of zero ranks serves nothing)")
    decode = world_size - prefill_ranks
    if getattr(model_config, "mla", None):
        raise ValueError(f"{model_config.name} caches one latent a token, not K/V heads; the hand-off moves heads")
    if decode < 1:
        raise ValueError(f"prefill_ranks = {prefill_ranks} of a job of {world_size} ranks leaves no rank to decode: "
                         f"give the decode pool at least one (prefill_ranks <= {world_size - 1})")
    problems = [f"the {name} pool of {n}: {problem}" for name, n in (("prefill", prefill_ranks), ("decode", decode))
                for problem in (tensor_parallel_problems(model_config, n) if model_config is not None else ())]
    if problems:
        valid = [p for p in range(1, world_size) if not tensor_parallel_problems(model_config, p)
                 and not tensor_parallel_problems(model_config, world_size - p)]
        raise ValueError(f"{prefill_ranks} prefill + {decode} decode ranks: each pool splits the model's "
                         f"{model_config.n_heads} query heads and {model_config.n_kv_heads} KV heads over its own "
                         "ranks, and this split does not:\n  " + "\n  ".join(problems)
                         + f"\nprefill_ranks that work on {world_size} ranks: {valid or 'none'}")
    return decode


def run_disaggregated(ranks, weights, requests, config, prefill_ranks: int | None = None,
                      layerwise: bool = False) -> DisaggregatedRun:
    """Serve ``requests`` with prefill on ranks ``0 .. prefill_ranks - 1`` (default: half) and decode on the
    others (any split ``check_split`` allows), the K/V handed over whole after a prompt's last step, or layer
    by layer during it (``layerwise``). Greedy unless a request has a seed: the tokens are ``run_serving``'s."""
    flag(layerwise, "layerwise")
    whole_number(ranks.world_size, "the job's world size")
    p = ranks.world_size // 2 if prefill_ranks is None else prefill_ranks
    d = check_split(ranks.world_size, p, weights.config if isinstance(weights, LlamaWeights) else None)
    requests, c = check_serving(weights, requests, config, p), weights.config
    links = {r.request_id: kv_bytes_per_link(c, len(r.prompt_token_ids), p, d, weights.embed.element_size())
             if r.max_new_tokens > 1 else {} for r in requests}  # one token: done at the prefill, nothing sent
    got = on_ranks(ranks, disaggregated_on_rank, weights, list(requests), config, p, layerwise)
    return DisaggregatedRun(got, requests, config, p, p, layerwise, links)


LOOPBACK = Link("loopback (gloo, one machine)", 1e9, 2e-4, source="about 0.9 GB/s for a 64 MiB all-reduce here",
                latency_source="a small point-to-point message on gloo over loopback: a fraction of a millisecond")
CONFIGURATIONS = ("colocated", "colocated, chunked prefill", "disaggregated", "disaggregated, layerwise")


@dataclass(frozen=True)
class Interference:
    """Decode steps of the colocated engine with chunked prefill, measured (median seconds) and predicted by
    the fitted step cost: those that carried only decodes, and those that carried prompt tokens too."""

    decode_only_s: float
    mixed_s: float
    n_decode_only: int
    n_mixed: int
    predicted_decode_only_s: float
    predicted_mixed_s: float

    @property
    def ratio(self) -> float:
        return self.mixed_s / self.decode_only_s

    @property
    def predicted_ratio(self) -> float:
        return self.predicted_mixed_s / self.predicted_decode_only_s


def interference(steps, cost) -> Interference:
    """``Interference`` measured from a colocated run's ``steps`` and predicted by ``cost``."""
    alone = [s for s in steps if s.n_decodes and s.n_tokens == s.n_decodes]
    mixed = [s for s in steps if s.n_decodes and s.n_tokens > s.n_decodes]
    if not alone or not mixed:
        raise ValueError(f"{len(alone)} decode-only and {len(mixed)} mixed steps: the run needs both (a trace whose "
                         "prompts arrive while others decode, with chunked prefill)")
    median = statistics.median
    return Interference(median(s.duration_s for s in alone), median(s.duration_s for s in mixed), len(alone),
                        len(mixed), median(cost.step_s(s.n_tokens, s.n_context) for s in alone),
                        median(cost.step_s(s.n_tokens, s.n_context) for s in mixed))


@dataclass(frozen=True)
class DisaggregationCheck:
    """The four configurations on one trace: ``runs[name]`` measured, ``predicted[name]`` its figures on the
    step cost fitted to a sibling's run (``costs[name]``); ``REPLICAS`` predicted only. Per objective: SLO
    attainment at the trace's rate, measured and predicted, and goodput per GPU predicted over
    ``sweep_rates``. The interference, and one verdict per claim."""

    requests: tuple
    rate_per_s: float
    gpus: int
    objectives: tuple
    runs: dict
    predicted: dict
    attainment: dict  # (configuration, objective label) -> measured share of requests meeting both
    predicted_attainment: dict
    predicted_goodput: dict  # (configuration, objective label) -> requests/s per GPU over ``sweep_rates``
    sweep_rates: tuple
    costs: dict
    interference: Interference
    verdicts: tuple
    handoff_s: dict | None = None  # disaggregated configuration -> (predicted, measured) median wait, seconds

    def measured(self, name: str) -> dict:
        return self.runs[name].figures(self.requests)


REPLICAS = "colocated replicas (predicted)"


def _trace_at(requests, rate_per_s: float, rate: float):
    """The same requests arriving ``rate / rate_per_s`` times as fast."""
    return [replace(r, arrival_s=r.arrival_s * rate_per_s / rate) for r in requests]


def default_objectives(cost, requests) -> tuple:
    """A tight and a loose objective set from a pool's fitted step cost: TTFT within 4 prefills of the
    longest prompt alone; TPOT within 2 (tight) or 8 (loose) decode steps of a batch of four."""
    n = max(len(r.prompt_token_ids) for r in requests)
    context = 4 * sum(len(r.prompt_token_ids) + r.max_new_tokens // 2 for r in requests) // len(requests)
    decode_s = cost.step_s(4, context)
    ttft_s = 4 * cost.step_s(n, n * (n + 1) // 2)
    return (ServingObjective(ttft_s, 2 * decode_s, 0.9, "tight TPOT"),
            ServingObjective(ttft_s, 8 * decode_s, 0.9, "loose TPOT"))


SIBLING = {"colocated": "colocated, chunked prefill", "colocated, chunked prefill": "colocated",
           "disaggregated": "disaggregated, layerwise", "disaggregated, layerwise": "disaggregated"}


def run_disaggregation_check(ranks, weights, requests, config, objectives=None, rate_per_s: float | None = None,
                             link=LOOPBACK, attempts: int = 3, runs=None) -> DisaggregationCheck:
    """Colocated (prefill first, and with chunked prefill) against disaggregated (whole and layer by layer,
    half the ranks in each pool) on the same ranks and ``requests``, each predicted on the step cost fitted to
    its sibling's run (``SIBLING``), so no run predicts itself. ``objectives`` default to
    ``default_objectives``; goodput per GPU is predicted over an eighth to 64 times the trace's rate
    (``rate_per_s``, read from the arrivals if not given). ``runs``: configurations already served on these
    ranks, requests and config, used by the first attempt.

    Verdicts (within 0.5-2, up to ``attempts`` tries): the K/V bytes handed off (exact), the interference
    ratio, the disaggregated TTFT p50, the TPOT p50 of colocated prefill-first over disaggregated, and the
    tokens per second of disaggregated over colocated with chunked prefill. Medians, not tails: one stalled
    process moves a p90."""
    requests = tuple(requests)
    p = ranks.world_size // 2
    check_split(ranks.world_size, p, weights.config if isinstance(weights, LlamaWeights) else None)
    configs = {"colocated": replace(config, chunked_prefill=False),
               "colocated, chunked prefill": replace(config, chunked_prefill=True)}
    for c in configs.values():
        check_serving(weights, requests, c, ranks.world_size)
    if rate_per_s is None:
        span = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
        if span <= 0:
            raise ValueError("the requests all arrive at once: give rate_per_s, the rate the sweep is centred on")
        rate_per_s = (len(requests) - 1) / span
    sweep = tuple(rate_per_s * 2.0 ** k for k in range(-3, 7))  # an eighth to 64 times the trace's rate
    model, replicas = weights.config, 2  # colocated replicas: one per pool's worth of ranks
    given = dict(runs or {})
    for o in objectives or ():
        if not isinstance(o, ServingObjective):
            raise ValueError(f"objectives are ServingObjective(ttft_s, tpot_s, share), got {type(o).__name__}")
    for name, run in given.items():
        if name not in CONFIGURATIONS:
            raise ValueError(f"runs names {name!r}: the configurations are {list(CONFIGURATIONS)}")
        if set(run.tokens) != {r.request_id for r in requests}:
            raise ValueError(f"the {name} run served other requests than these: serve the same trace")
        if name.startswith("disagg") and (run.prefill_ranks != p or run.layerwise != name.endswith("layerwise")):
            raise ValueError(f"the {name} run has {run.prefill_ranks} prefill ranks (layerwise {run.layerwise}): "
                             f"the check splits {p} + {p}")

    def serve(name):
        if name in given:
            return given.pop(name)  # the first attempt only
        if name.startswith("colocated"):
            return run_serving(ranks, weights, requests, configs[name])
        return run_disaggregated(ranks, weights, requests, config, p, layerwise=name.endswith("layerwise"))

    def measure():
        runs = {name: serve(name) for name in CONFIGURATIONS}
        costs = {name: runs[SIBLING[name]].step_cost(weights) for name in CONFIGURATIONS}
        costs[REPLICAS] = costs["disaggregated"]  # one engine on a pool's worth of ranks: the pools' step cost
        simulated = {n: predict(n, requests, costs) for n in CONFIGURATIONS + (REPLICAS,)}
        return runs, costs, simulated, interference(runs["colocated, chunked prefill"].steps,
                                                    costs["colocated, chunked prefill"])

    def predict(name, trace, costs):
        if name == REPLICAS:  # the requests dealt round robin over the replicas
            return PredictedServing(simulate_colocated(trace, config, costs[name], replicas), ())
        if name.startswith("colocated"):
            return simulate_serving(trace, configs[name], costs[name])
        return simulate_pools(trace, config, costs[name], link, model, p, layerwise=name.endswith("layerwise"))

    def verdicts(result):
        runs, _, simulated, inter = result
        pred = {n: simulated[n].figures(requests) for n in CONFIGURATIONS}
        meas = {n: r.figures(requests) for n, r in runs.items()}
        whole = runs["disaggregated"]
        sent, predicted_bytes = sum(whole.kv_bytes_sent.values()), sum(whole.kv_bytes_predicted.values())
        return [Verdict("K/V bytes handed off, every request", predicted_bytes, sent, "bytes", low=1.0, high=1.0),
                Verdict("interference: a decode step with prompt tokens over one without", inter.predicted_ratio,
                        inter.ratio, "x"),
                Verdict("TTFT p50, disaggregated", pred["disaggregated"]["ttft_p50_s"],
                        meas["disaggregated"]["ttft_p50_s"]),
                Verdict("TPOT p50, colocated (prefill first) over disaggregated",
                        pred["colocated"]["tpot_p50_s"] / pred["disaggregated"]["tpot_p50_s"],
                        meas["colocated"]["tpot_p50_s"] / meas["disaggregated"]["tpot_p50_s"], "x"),
                Verdict("tokens/s, disaggregated over colocated with chunked prefill",
                        pred["disaggregated"]["tokens_per_s"] / pred["colocated, chunked prefill"]["tokens_per_s"],
                        meas["disaggregated"]["tokens_per_s"] / meas["colocated, chunked prefill"]["tokens_per_s"],
                        "x")]

    (runs, costs, simulated, inter), found = verified(measure, verdicts, attempts)
    objectives = tuple(objectives) if objectives is not None else default_objectives(costs["disaggregated"], requests)

    def metrics(predicted, trace):
        arrivals = {r.request_id: r for r in trace}
        return [request_metrics(arrivals[rid], t) for rid, t in predicted.token_times_s.items()]

    names = CONFIGURATIONS + (REPLICAS,)
    swept = {n: {rate: metrics(predict(n, trace, costs), trace) for rate in sweep
                 for trace in [_trace_at(requests, rate_per_s, rate)]} for n in names}
    keys = [(n, o) for o in objectives for n in names]
    attained = {(n, o.label): slo_attainment(runs[n].metrics, o) for n, o in keys if n in runs}
    predicted_attained = {(n, o.label): slo_attainment(metrics(simulated[n], requests), o) for n, o in keys}
    good = {(n, o.label): goodput(swept[n], o, ranks.world_size) for n, o in keys}  # every GPU of the job
    predicted = {n: simulated[n].figures(requests) for n in names}
    handoff = {n: (statistics.median(simulated[n].admitted_s.values()), statistics.median(runs[n].handoff_s.values()))
               for n in CONFIGURATIONS[2:] if runs[n].handoff_s}
    return DisaggregationCheck(requests, rate_per_s, ranks.world_size, objectives, runs, predicted, attained,
                               predicted_attained, good, sweep, costs, inter, found, handoff)
