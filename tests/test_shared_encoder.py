"""SharedEncoder: same vectors as the wrapped encoder, concurrent callers batched, streaming."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from uibk_embedding.encoder.shared import SharedEncoder
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
from uibk_embedding.testing import batching_noise

TEXTS = [
    "lift on a wing in a propeller slipstream",
    "laminar to turbulent transition in the boundary layer of a flat plate",
    "heat transfer to a blunt body in hypersonic flow",
    "panel flutter in supersonic flow",
    "oblique shock wave and a laminar boundary layer interaction at high mach number",
    "dielectric constant of liquids",
]


@pytest.fixture(scope="module")
def inner():
    cfg = UIBKConfig.tiny()
    return UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=1)


@pytest.fixture(scope="module")
def bound(inner) -> float:
    """How far one text's list may move between two batchings (merged passes put other texts
    beside it): twice the wrapped encoder's batching noise on these texts, measured here."""
    import torch

    t = torch.get_num_threads()
    return 2 * batching_noise(inner, TEXTS, batchings=((2, t), (3, t), (len(TEXTS), t)), shuffles=3)


def test_single_caller_gets_the_wrapped_encoders_bytes(inner):
    with SharedEncoder(inner) as enc:
        assert enc.format == inner.format and enc.dense_weight == inner.dense_weight
        assert enc.device == inner.device
        assert inner.dtype == ("bfloat16" if inner.device.startswith("cuda") else "float32")
        for a, b in zip(enc.encode_documents(TEXTS), inner.encode_documents(TEXTS), strict=True):
            assert a.tobytes() == b.tobytes()
        for a, b in zip(enc.encode_queries(TEXTS, dense_weight=3.0),
                        inner.encode_queries(TEXTS, dense_weight=3.0), strict=True):
            assert a.tobytes() == b.tobytes()


def test_concurrent_callers_are_batched_together(inner, bound):
    expected = inner.encode_documents(TEXTS)
    results: dict[int, list[np.ndarray]] = {}
    barrier = threading.Barrier(4)

    def call(k: int) -> None:
        barrier.wait()
        results[k] = enc.encode_documents(TEXTS[k:] + TEXTS[:k])

    with SharedEncoder(inner, max_wait_ms=300) as enc:
        threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = enc.stats()
    assert s["requests"] == 4 and s["texts"] == 4 * len(TEXTS)
    assert s["merged_passes"] >= 1 and s["max_requests_per_pass"] >= 2
    assert s["passes"] < 4, s  # fewer forward passes than callers
    for k, got in results.items():
        want = expected[k:] + expected[:k]
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, atol=bound, rtol=0)  # other batch-mates


def test_token_budget_cuts_length_sorted_batches(inner, bound):
    with SharedEncoder(inner, batch_tokens=64) as enc:
        out = enc.encode_documents(TEXTS)
        s = enc.stats()
    order = inner._length_order(TEXTS)
    assert order[0] == 4  # longest first
    assert s["passes"] == len(list(inner._batches(TEXTS, order, False))) > 1
    for a, b in zip(out, inner.encode_documents(TEXTS), strict=True):
        np.testing.assert_allclose(a, b, atol=bound, rtol=0)


def test_streaming_keeps_a_bounded_number_of_texts_in_flight(inner, bound):
    drawn = 0

    def gen():
        nonlocal drawn
        for i in range(40):
            drawn += 1
            yield TEXTS[i % len(TEXTS)]

    with SharedEncoder(inner) as enc:
        it = enc.encode_documents_iter(gen(), chunk_size=4, in_flight=2)
        first = next(it)
        assert drawn <= 3 * 4  # at most in_flight chunks (+ the one being read) were drawn
        rest = list(it)
    assert len(rest) + 1 == 40
    want = inner.encode_documents([TEXTS[i % len(TEXTS)] for i in range(40)])
    np.testing.assert_allclose(first, want[0], atol=bound, rtol=0)
    for a, b in zip(rest, want[1:], strict=True):
        np.testing.assert_allclose(a, b, atol=bound, rtol=0)


def test_progress_bar_for_long_jobs(inner, capsys):
    with SharedEncoder(inner, chunk_texts=8) as enc:
        enc.encode_documents(TEXTS * 5, show_progress=True)
    assert "encoding documents" in capsys.readouterr().err


def test_bad_input_and_lifetime(inner):
    enc = SharedEncoder(inner)
    assert enc.encode_documents([]) == []
    with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
        enc.encode_documents(["ok", " "])
    with pytest.raises(TypeError, match="single string"):
        enc.encode_queries("one string")
    with pytest.raises(ValueError, match="dense_weight"):
        enc.encode_queries(["q"], dense_weight=-1)
    with pytest.raises(ValueError, match=r"^texts\[4\] is empty"):
        list(enc.encode_documents_iter(iter(["a", "b", "c", "d", ""]), chunk_size=4))
    enc.close()
    with pytest.raises(RuntimeError, match="closed"):
        enc.encode_documents(["late"])
    with pytest.raises(TypeError, match="TaggedEncoder"):
        SharedEncoder(object())  # type: ignore[arg-type]


def test_a_model_error_reaches_the_caller_and_the_worker_lives_on(inner):
    class Fails(UIBKEncoder):
        def _tokenize(self, texts, is_query):  # the pipeline's first step, for a given text
            if any("boom" in t for t in texts):
                raise RuntimeError("model exploded")
            return super()._tokenize(texts, is_query)

    broken = Fails(inner.model, inner.tokenizer, inner.uibk_config)
    with SharedEncoder(broken) as enc:
        with pytest.raises(RuntimeError, match="model exploded"):
            enc.encode_documents(["boom"])
        assert len(enc.encode_documents(["fine"])) == 1
        assert enc.stats()["errors"] == 1


def test_wraps_the_embedded_default(encoder):
    with SharedEncoder(encoder) as enc:
        got = enc.encode_documents(TEXTS[:3])
    for a, b in zip(got, encoder.encode_documents(TEXTS[:3]), strict=True):
        assert a.tobytes() == b.tobytes()


class _SignallingLock:
    """The encoder's lock, which says when another thread starts waiting for it."""

    def __init__(self) -> None:
        self.lock, self.waiting = threading.Lock(), threading.Event()

    def __enter__(self):
        self.waiting.set()
        self.lock.acquire()
        return self

    def __exit__(self, *exc):
        self.lock.release()


def _queued_behind_a_pass(enc, gate, requests, while_queued=None):
    """Submit one request the worker's pass blocks on (``gate`` held), then ``requests`` (texts
    each), which wait in the queue and are gathered into the next pass together; ``while_queued``
    gets their futures before the gate opens. Returns the first future and theirs."""
    gate.lock.acquire()
    try:
        busy = enc.submit(TEXTS[:1], is_query=False)
        assert gate.waiting.wait(30), "the worker never reached the model"
        futures = [enc.submit(t, is_query=False) for t in requests]
        if while_queued is not None:
            while_queued(futures)
    finally:
        gate.lock.release()
    return busy, futures


def test_a_cancelled_request_does_not_fail_its_batch_mates(inner, monkeypatch):
    """A caller that cancels its future while it waits in the queue (a client gone during serve's
    shutdown) is dropped; the requests batched with it still get their lists."""
    gate = _SignallingLock()
    monkeypatch.setattr(inner, "_lock", gate)
    with SharedEncoder(inner, max_wait_ms=0) as enc:
        def cancel_the_first(futures):
            assert futures[0].cancel(), "the request was already running: the test proved nothing"

        busy, (_gone, kept) = _queued_behind_a_pass(enc, gate, [TEXTS[1:3], TEXTS[3:5]], cancel_the_first)
        got = kept.result(timeout=60)
        assert len(busy.result(timeout=60)) == 1
    monkeypatch.undo()
    want = inner.encode_documents(TEXTS[3:5])
    assert [a.tobytes() for a in got] == [b.tobytes() for b in want]


def test_a_request_that_fails_does_not_fail_its_batch_mates(inner, bound, monkeypatch):
    """Requests merged into one pass with a request whose input the model fails on: the pass is
    run again per request, so only that request gets the error (all of them got it: on the
    server, one client's bad text failed every other client's request in the pass)."""
    class Fails(UIBKEncoder):
        def _tokenize(self, texts, is_query):
            if any("boom" in t for t in texts):
                raise RuntimeError("model exploded")
            return super()._tokenize(texts, is_query)

    broken = Fails(inner.model, inner.tokenizer, inner.uibk_config,
                   projections={"R": inner.R, "P": inner.P})  # inner's lists, so inner's bound
    gate = _SignallingLock()
    monkeypatch.setattr(broken, "_lock", gate)
    with SharedEncoder(broken, max_wait_ms=0) as enc:
        busy, (bad, good) = _queued_behind_a_pass(enc, gate, [["boom", TEXTS[2]], TEXTS[3:5]])
        got = good.result(timeout=60)
        with pytest.raises(RuntimeError, match="model exploded"):
            bad.result(timeout=60)
        assert len(busy.result(timeout=60)) == 1
        assert enc.stats()["errors"] == 1
    monkeypatch.undo()
    for a, b in zip(got, inner.encode_documents(TEXTS[3:5]), strict=True):  # batched with others
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=bound, rtol=0)


class _ZeroVectorFor(UIBKEncoder):
    """The model gives the text ``TEXTS[5]`` a zero sentence vector (a simulated fault)."""

    def _tokenize(self, texts, is_query):
        import torch

        tb = super()._tokenize(texts, is_query)
        tb.inputs["zero"] = torch.tensor([t == TEXTS[5] for t in texts])
        return tb

    def _forward(self, inputs):
        zero = inputs.pop("zero")
        g, states = super()._forward(inputs)
        g = g.clone()
        g[zero] = 0
        return g, states


def test_a_zero_vector_names_the_texts_position_in_the_call(inner):
    # the call is cut into requests of 2 texts: the error named the text's position in its
    # request ("text 1" for the sixth text of the call or of the stream)
    broken = _ZeroVectorFor(inner.model, inner.tokenizer, inner.uibk_config)
    texts = [*TEXTS[:5], TEXTS[5], TEXTS[0]]
    message = "text 5: the model gave a zero or non-finite vector"
    with pytest.raises(ValueError, match=message):
        broken.encode_documents(texts)  # the wrapped encoder itself
    with pytest.raises(ValueError, match=message):
        list(broken.encode_documents_iter(iter(texts), chunk_size=2))  # and its stream
    with SharedEncoder(broken, chunk_texts=2) as enc:
        with pytest.raises(ValueError, match=message):
            enc.encode_documents(texts)
        with pytest.raises(ValueError, match=message):
            enc.encode_queries(texts)
        with pytest.raises(ValueError, match=message):
            list(enc.encode_documents_iter(iter(texts), chunk_size=2))
        with pytest.raises(ValueError, match=message):
            list(enc.encode_documents_iter(iter(texts), chunk_size=4))


@pytest.mark.parametrize("ms", [float("inf"), 1e13, float("nan"), -1.0, 60_001.0])
def test_a_merging_window_that_is_not_a_finite_minute_at_most_is_refused(inner, ms):
    """``max_wait_ms=inf`` (or past about 9e12) was accepted, and the worker thread died on its
    first request (an OverflowError in queue.get): every call waited forever."""
    with pytest.raises(ValueError, match="max_wait_ms must be"):
        SharedEncoder(inner, max_wait_ms=ms).close()


def test_a_worker_that_fails_fails_its_callers_instead_of_leaving_them_waiting(inner):
    """A failure of the worker thread itself (not of the model: that one reaches the request it
    belongs to) killed the thread silently, and every queued and later request waited forever.
    It now fails them, and ``worker_error`` says why (the server's /health reads it)."""
    enc = SharedEncoder(inner)
    enc.max_wait = float("inf")  # past the constructor's check: queue.get(timeout=inf) fails
    try:
        future = enc.submit(TEXTS[:1], is_query=False)
        with pytest.raises(RuntimeError, match=r"worker thread failed.*OverflowError"):
            future.result(timeout=60)  # a bound against a hang, not a timing
        assert isinstance(enc.worker_error, OverflowError)
        with pytest.raises(RuntimeError, match=r"worker thread failed.*OverflowError"):
            enc.encode_documents(TEXTS[:1])
    finally:
        enc.close()


def test_a_chunk_size_below_one_is_refused_not_an_empty_stream(inner):
    """``encode_documents_iter(texts, chunk_size=0)`` returned nothing, silently: the texts were
    never encoded (and SharedEncoder took 0 for its default)."""
    from uibk_embedding.encoder.inputs import text_chunks

    for size in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            text_chunks(TEXTS, size)
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            list(inner.encode_documents_iter(TEXTS, chunk_size=size))
    with SharedEncoder(inner) as enc:
        with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
            list(enc.encode_documents_iter(TEXTS, chunk_size=0))
        assert len(list(enc.encode_documents_iter(TEXTS, chunk_size=None))) == len(TEXTS)
    assert list(text_chunks(iter("abc"), 2)) == [["a", "b"], ["c"]]


def test_a_submit_racing_close_is_served_not_left_waiting(inner):
    """``close()`` set its flag and queued the stop without the submit lock, so a ``submit`` that
    had passed its check could queue its request after the stop, and its caller waited for good.
    Forced here: the request's put waits (2 s at most) for the stop to be queued first; now close
    waits for the submit instead, and the request is served."""
    from uibk_embedding.encoder.shared import _STOP

    enc = SharedEncoder(inner, max_wait_ms=0)
    real_put, in_put, stop_queued = enc._queue.put, threading.Event(), threading.Event()

    def put(item, *args, **kwargs):
        if item is _STOP:
            real_put(item, *args, **kwargs)
            stop_queued.set()
            return
        in_put.set()
        stop_queued.wait(timeout=2)  # the old close() queued the stop meanwhile
        real_put(item, *args, **kwargs)

    enc._queue.put = put
    futures = []
    submitter = threading.Thread(target=lambda: futures.append(enc.submit(TEXTS[:1], is_query=False)))
    submitter.start()
    assert in_put.wait(timeout=60)
    closer = threading.Thread(target=enc.close)
    closer.start()
    submitter.join(timeout=60)
    closer.join(timeout=60)
    assert len(futures[0].result(timeout=60)) == 1  # a bound against a hang, not a timing
