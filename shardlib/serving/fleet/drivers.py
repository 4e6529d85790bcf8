"""``run_disaggregated``: a prefill pool and a decode pool on a warm pool of ranks, every request checked
before any rank starts.

Returns a ``DisaggregatedRun``, the engine's ``ServingRun`` (tokens, token times, metrics per request)
plus the hand-off: ``kv_bytes_sent[request_id]``, the bytes of that request's K/V read from the comm log's
point-to-point records (the ``handoff`` group's sends, every prefill rank together), beside
``kv_bytes_predicted[request_id]`` (``handoff.kv_bytes_per_request`` times the ranks of a pool).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from ...checks import flag, whole_number
from ...hardware import Link
from ...runtime.gather import gather
from ...runtime.verdict import Verdict, verified
from ..engine.drivers import FIGURE_WORDS, ServingRun, check_serving, run_serving, tensor_parallel_problems
from ..engine.llama import LlamaWeights
from ..engine.predict import fit_step_cost, simulate_serving
from ..engine.ranks import StepRecord
from ..engine.requests import request_metrics
from .disagg import disaggregated_on_rank
from .goodput import ServingObjective, goodput, slo_attainment
from .handoff import kv_bytes_per_request
from .pools import simulate_pools


@dataclass(frozen=True)
class DisaggregatedRun(ServingRun):
    """A disaggregated run: the engine's figures, each pool's steps, and the K/V each request handed off
    (bytes measured from the comm log, and predicted), with the seconds each spent in flight."""

    prefill_ranks: int = 1
    decode_ranks: int = 1
    layerwise: bool = False
    prefill_steps: tuple[StepRecord, ...] = ()
    decode_steps: tuple[StepRecord, ...] = ()
    kv_bytes_sent: dict = field(default_factory=dict)
    kv_bytes_predicted: dict = field(default_factory=dict)
    kv_messages: dict = field(default_factory=dict)  # request id -> K/V messages sent, every prefill rank together


def check_split(world_size: int, prefill_ranks: int, model_config) -> int:
    """The decode pool's size, or a ValueError saying why ``prefill_ranks`` does not split the job."""
    if isinstance(prefill_ranks, bool) or not isinstance(prefill_ranks, int) or prefill_ranks < 1:
        raise ValueError(f"prefill_ranks must be a whole number of ranks, at least 1 (a pool of zero ranks "
                         f"serves nothing), got {prefill_ranks!r}")
    decode = world_size - prefill_ranks
    if decode < 1:
        raise ValueError(f"prefill_ranks = {prefill_ranks} of a job of {world_size} ranks leaves no rank to decode: "
                         f"give the decode pool at least one (prefill_ranks <= {world_size - 1})")
    if decode != prefill_ranks:
        raise ValueError(f"{prefill_ranks} prefill + {decode} decode ranks: each prefill rank hands its KV heads to "
                         "the decode rank of the same tensor-parallel index, so the pools must be the same size "
                         f"(prefill_ranks = {world_size / 2:g} of {world_size})")
    problems = tensor_parallel_problems(model_config, prefill_ranks) if model_config is not None else []
    if problems:
        raise ValueError(f"each pool splits the model over its {prefill_ranks} ranks, and it does not split:\n  "
                         + "\n  ".join(problems))
    return decode


def run_disaggregated(ranks, weights, requests, config, prefill_ranks: int = 1,
                      layerwise: bool = False) -> DisaggregatedRun:
    """Serve ``requests`` with prefill on ranks ``0 .. prefill_ranks - 1`` and decode on the others, the
    K/V handed over whole after a prompt's last step, or layer by layer during it (``layerwise``). Greedy
    unless a request has a seed: the tokens are those of ``run_serving``."""
    flag(layerwise, "layerwise")
    whole_number(ranks.world_size, "the job's world size")
    decode = check_split(ranks.world_size, prefill_ranks,
                         weights.config if isinstance(weights, LlamaWeights) else None)
    requests = check_serving(weights, requests, config, prefill_ranks)
    got = gather(ranks.run(disaggregated_on_rank, weights, requests, config, prefill_ranks, layerwise))
    head, tail = got.results[0], got.results[prefill_ranks]  # the two leaders
    tokens, times, preempted = {}, {}, {}
    for rid, (first, first_s, n) in head.outputs.items():
        tokens[rid], times[rid], preempted[rid] = (first,), (first_s,), n
    for rid, (out, out_s, n) in tail.outputs.items():
        tokens[rid], times[rid], preempted[rid] = out, out_s, preempted[rid] + n
    by_id = {r.request_id: r for r in requests}
    sent, messages = _kv_bytes_sent(ranks.last_comm, got.results[:prefill_ranks], requests)
    element = weights.embed.element_size()
    predicted = {r.request_id: (prefill_ranks * kv_bytes_per_request(weights.config, len(r.prompt_token_ids),
                                                                    prefill_ranks, element)
                                if r.max_new_tokens > 1 else 0) for r in requests}
    return DisaggregatedRun(
        tokens=tokens, token_times_s=times,
        metrics={rid: request_metrics(by_id[rid], times[rid], preempted[rid]) for rid in tokens},
        steps=tuple(sorted(head.steps + tail.steps, key=lambda s: s.start_s)),
        kv_cache_bytes=got.each("kv_cache_bytes"),
        prefix_hit_tokens=head.prefix_hit_tokens, prefix_lookup_tokens=head.prefix_lookup_tokens,
        preemptions=head.preemptions + tail.preemptions, tp=prefill_ranks, block_size=config.block_size,
        prefill_ranks=prefill_ranks, decode_ranks=decode, layerwise=layerwise, prefill_steps=head.steps,
        decode_steps=tail.steps, kv_bytes_sent=sent, kv_bytes_predicted=predicted, kv_messages=messages)


def _kv_bytes_sent(comm, prefill_results, requests) -> tuple[dict, dict]:
    """Per request, the bytes (and messages) of its K/V: the ``handoff`` sends in each prefill rank's comm
    log, matched in order to the requests that rank says it sent."""
    sent = {r.request_id: 0 for r in requests}
    messages = {r.request_id: 0 for r in requests}
    for result in prefill_results:
        records = [c for c in comm if c.rank == result.rank and c.op == "send" and c.group == "handoff"]
        if len(records) != len(result.kv_sent):
            raise RuntimeError(f"rank {result.rank} logged {len(records)} K/V sends but sent {len(result.kv_sent)}")
        for record, i in zip(records, result.kv_sent):
            sent[requests[i].request_id] += record.size_bytes
            messages[requests[i].request_id] += 1
    return sent, messages


# -- colocated against disaggregated, predicted then measured ----------------------------------------------
LOOPBACK = Link("loopback (gloo, one machine)", 1e9, 2e-4, source="about 0.9 GB/s for a 64 MiB all-reduce here",
                latency_source="a small point-to-point message on gloo over loopback: a fraction of a millisecond")
CONFIGURATIONS = ("colocated", "colocated, chunked prefill", "disaggregated", "disaggregated, layerwise")


@dataclass(frozen=True)
class Interference:
    """Decode steps of the colocated engine with chunked prefill: the median seconds of those that carried
    only decodes, and of those that carried prompt tokens too (the interference a decode feels), with the
    fitted step cost's prediction of the same two steps."""

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

    @property
    def line(self) -> str:
        return (f"a decode step with prompt tokens took {self.mixed_s * 1e3:.2f} ms (median of {self.n_mixed}), one "
                f"without {self.decode_only_s * 1e3:.2f} ms (median of {self.n_decode_only}): {self.ratio:.1f}x")


def interference(steps, cost) -> Interference:
    """``Interference`` measured from a colocated run's ``steps`` and predicted by ``cost``."""
    alone = [s for s in steps if s.n_decodes and s.n_tokens == s.n_decodes]
    mixed = [s for s in steps if s.n_decodes and s.n_tokens > s.n_decodes]
    if not alone or not mixed:
        raise ValueError(f"{len(alone)} decode-only and {len(mixed)} mixed steps: the run needs both (a trace whose "
                         "prompts arrive while others decode, with chunked prefill)")

    def median(values):
        return statistics.median(values)

    return Interference(median(s.duration_s for s in alone), median(s.duration_s for s in mixed), len(alone),
                        len(mixed), median(cost.step_s(s.n_tokens, s.n_context) for s in alone),
                        median(cost.step_s(s.n_tokens, s.n_context) for s in mixed))


@dataclass(frozen=True)
class DisaggregationCheck:
    """The four configurations on one trace (``CONFIGURATIONS``): ``runs[name]`` measured and
    ``predicted[name]`` its figures predicted on the step cost fitted to a sibling's run (``costs[name]``);
    ``REPLICAS`` is predicted only (the pools' step cost, one colocated engine per pool's worth of ranks).
    Per objective: SLO attainment at the trace's rate, measured and predicted, and goodput per GPU predicted
    over ``sweep_rates``. The interference, and one verdict per claim."""

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

    def measured(self, name: str) -> dict:
        return self.runs[name].figures(self.requests)

    def table(self) -> str:
        """One row per configuration: TTFT and TPOT at p50 and p90 (ms), tokens per second, and per objective
        the share of requests meeting it at this rate and the goodput per GPU predicted over the sweep."""
        figs = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
        head = f"{'':<30}" + "".join(f"{FIGURE_WORDS[f] + ' ms':>16}" for f in figs) + f"{'tokens/s':>15}"
        for o in self.objectives:
            head += f"{'met, ' + o.name:>18}{'goodput/GPU':>13}"
        rows = [head, f"{'':<30}{'(predicted / measured)':>64}"]
        for name in self.predicted:
            p = self.predicted[name]
            m = self.measured(name) if name in self.runs else None
            row = f"{name:<30}"
            for f in figs:
                row += f"{p[f] * 1e3:>8.1f} /" + (f"{m[f] * 1e3:>6.1f}" if m else f"{'-':>6}")
            row += f"{p['tokens_per_s']:>8.0f} /" + (f"{m['tokens_per_s']:>5.0f}" if m else f"{'-':>5}")
            for o in self.objectives:
                key = (name, o.label)
                measured = f"{self.attainment[key]:>5.0%}" if key in self.attainment else f"{'-':>5}"
                row += f"{self.predicted_attainment[key]:>11.0%} /{measured}{self.predicted_goodput[key]:>12.1f}"
            rows.append(row)
        return "\n".join(rows)


REPLICAS = "colocated replicas (predicted)"


def _trace_at(requests, rate_per_s: float, rate: float):
    """The same requests arriving ``rate / rate_per_s`` times as fast."""
    return [replace(r, arrival_s=r.arrival_s * rate_per_s / rate) for r in requests]


def default_objectives(cost, requests) -> tuple:
    """A tight and a loose objective set from a pool's fitted step cost: TTFT within 8 prefills of the
    longest prompt alone; TPOT within 3 (tight) or 12 (loose) decode steps of a batch of four."""
    n = max(len(r.prompt_token_ids) for r in requests)
    context = 4 * sum(len(r.prompt_token_ids) + r.max_new_tokens // 2 for r in requests) // len(requests)
    decode_s = cost.step_s(4, context)
    ttft_s = 8 * cost.step_s(n, n * (n + 1) // 2)
    return (ServingObjective(ttft_s, 3 * decode_s, 0.9, "tight TPOT"),
            ServingObjective(ttft_s, 12 * decode_s, 0.9, "loose TPOT"))


SIBLING = {"colocated": "colocated, chunked prefill", "colocated, chunked prefill": "colocated",
           "disaggregated": "disaggregated, layerwise", "disaggregated, layerwise": "disaggregated"}


def run_disaggregation_check(ranks, weights, requests, config, objectives=None, rate_per_s: float | None = None,
                             link=LOOPBACK, attempts: int = 3) -> DisaggregationCheck:
    """Colocated (prefill first, and with chunked prefill) against disaggregated (whole and layer by layer,
    half the ranks in each pool) on the same ranks and ``requests``. Each configuration is predicted on the
    step cost fitted to its sibling's run (``SIBLING``: the colocated pair predict each other, the two
    disaggregated runs each other), so no run predicts itself and no extra run is needed. ``objectives``:
    ``ServingObjective`` s (default: a tight and a loose TPOT, ``default_objectives``); goodput per GPU of the
    job is predicted over rates from an eighth to 16 times the trace's (``rate_per_s``, read from its
    arrivals if not given).

    Verdicts (measured / predicted within 0.5-2; the whole measurement repeated up to ``attempts`` times until
    all hold, ``runtime.verdict.verified``): the K/V bytes handed off (exact), the interference ratio, the
    TTFT p50 of the disaggregated run, the tokens per second of disaggregated over colocated with chunked
    prefill; and one-sided, that colocated prefill-first has the higher TPOT p90 (what splitting buys a
    decode: no prompt computed in its way), its predicted ratio shown for scale."""
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
    sweep = tuple(rate_per_s * 2.0 ** k for k in range(-3, 5))  # an eighth to 16 times the trace's rate
    element, model = weights.embed.element_size(), weights.config
    replicas = ranks.world_size // p

    def measure():
        runs = {name: run_serving(ranks, weights, requests, configs[name]) for name in CONFIGURATIONS[:2]}
        runs.update({name: run_disaggregated(ranks, weights, requests, config, p, layerwise=name.endswith("layerwise"))
                     for name in CONFIGURATIONS[2:]})
        costs = {}
        for name in CONFIGURATIONS:
            sibling = runs[SIBLING[name]]
            steps = sibling.prefill_steps + sibling.decode_steps if name.startswith("disagg") else sibling.steps
            costs[name] = fit_step_cost(steps, model, element)
        costs[REPLICAS] = costs["disaggregated"]  # one engine on a pool's worth of ranks: the pools' step cost
        return runs, costs

    def predict(name, trace, costs):
        if name == REPLICAS:  # each replica takes every replicas-th request: round robin
            return simulate_serving(trace[::replicas], configs["colocated, chunked prefill"], costs[name])
        if name.startswith("colocated"):
            return simulate_serving(trace, configs[name], costs[name])
        return simulate_pools(trace, config, costs[name], link, model, p, layerwise=name.endswith("layerwise"))

    def verdicts(result):
        runs, costs = result
        pred = {n: predict(n, requests, costs).figures(requests) for n in CONFIGURATIONS}
        meas = {n: r.figures(requests) for n, r in runs.items()}
        inter = interference(runs["colocated, chunked prefill"].steps, costs["colocated, chunked prefill"])
        whole = runs["disaggregated"]
        sent, predicted_bytes = sum(whole.kv_bytes_sent.values()), sum(whole.kv_bytes_predicted.values())
        return [Verdict("K/V bytes handed off, every request", predicted_bytes, sent, "bytes", low=1.0, high=1.0),
                Verdict("interference: a decode step with prompt tokens over one without", inter.predicted_ratio,
                        inter.ratio, "x"),
                Verdict("TTFT p50, disaggregated", pred["disaggregated"]["ttft_p50_s"],
                        meas["disaggregated"]["ttft_p50_s"]),
                Verdict.one_sided("TPOT p90, colocated (prefill first) over disaggregated",
                                  pred["colocated"]["tpot_p90_s"] / pred["disaggregated"]["tpot_p90_s"],
                                  meas["colocated"]["tpot_p90_s"] / meas["disaggregated"]["tpot_p90_s"], "x",
                                  at_least=1.0),
                Verdict("tokens/s, disaggregated over colocated with chunked prefill",
                        pred["disaggregated"]["tokens_per_s"] / pred["colocated, chunked prefill"]["tokens_per_s"],
                        meas["disaggregated"]["tokens_per_s"] / meas["colocated, chunked prefill"]["tokens_per_s"],
                        "x")]

    (runs, costs), found = verified(measure, verdicts, attempts)
    objectives = tuple(objectives) if objectives is not None else default_objectives(costs["disaggregated"], requests)
    for o in objectives:
        if not isinstance(o, ServingObjective):
            raise ValueError(f"objectives are ServingObjective(ttft_s, tpot_s, share), got {type(o).__name__}")
    def metrics(predicted, trace):
        arrivals = {r.request_id: r for r in trace}
        return [request_metrics(arrivals[rid], t) for rid, t in predicted.token_times_s.items()]

    names = CONFIGURATIONS + (REPLICAS,)
    here = {n: metrics(predict(n, requests, costs), requests) for n in names}
    swept = {n: {rate: metrics(predict(n, trace, costs), trace) for rate in sweep
                 for trace in [_trace_at(requests, rate_per_s, rate)]} for n in names}
    attained, predicted_attained, good = {}, {}, {}
    for o in objectives:
        for n in names:
            predicted_attained[n, o.label] = slo_attainment(here[n], o)
            good[n, o.label] = goodput(swept[n], o, ranks.world_size)  # the whole trace's rate, every GPU
            if n in runs:
                attained[n, o.label] = slo_attainment(runs[n].metrics, o)
    predicted = {n: predict(n, requests, costs).figures(requests[::replicas] if n == REPLICAS else requests)
                 for n in names}
    predicted[REPLICAS]["tokens_per_s"] *= replicas  # every replica's tokens
    return DisaggregationCheck(requests, rate_per_s, ranks.world_size, objectives, runs, predicted, attained,
                               predicted_attained, good, sweep, costs,
                               interference(runs["colocated, chunked prefill"].steps,
                                            costs["colocated, chunked prefill"]), found)
