"""The members of gunicorn's threaded worker that ``common.server.worker.ScorerWorker`` relies on.

The worker overrides nine public methods of gunicorn's gthread worker (none private: no name
gunicorn marks with an underscore), its parser's ``finish_body`` and its request's
``set_body_reader``, and uses its attributes and helpers; only the version pin in
requirements.txt guards them. Each test here states one thing the worker takes for granted, so
a gunicorn upgrade that changes it fails here, in CI, and not on a user's node.
"""

from __future__ import annotations

import inspect

import pytest
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.unreader import Unreader
from gunicorn.workers import gthread

from common.server.worker import FramedParser, FramedRequest, FramedUnreader, ScorerWorker

pytestmark = pytest.mark.unit

# Each method ScorerWorker overrides, with the parameters gunicorn calls it with.
OVERRIDDEN = {
    "init_process": ["self"],
    "load_wsgi": ["self"],
    "wait_for_and_dispatch_events": ["self", "timeout"],
    "accept": ["self", "listener"],
    "enqueue_req": ["self", "conn"],
    "murder_pending": ["self"],
    "handle": ["self", "conn"],
    "finish_request": ["self", "conn", "fs"],
    "handle_exit": ["self", "sig", "frame"],
}


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def _source(name: str) -> str:
    return inspect.getsource(getattr(gthread.ThreadWorker, name))


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_each_overridden_member_exists_in_gunicorn_with_the_same_parameters(name: str) -> None:
    assert name in vars(ScorerWorker), f"ScorerWorker no longer overrides {name}: update OVERRIDDEN"
    gunicorn_member = inspect.getattr_static(gthread.ThreadWorker, name, None)
    assert gunicorn_member is not None, f"gunicorn's ThreadWorker has no {name}: the override is dead"
    assert _parameters(getattr(gthread.ThreadWorker, name)) == OVERRIDDEN[name]
    assert _parameters(getattr(ScorerWorker, name)) == OVERRIDDEN[name]


def test_every_override_of_scorer_worker_is_pinned() -> None:
    overrides = {
        name for name, member in vars(ScorerWorker).items()
        if callable(member) and hasattr(gthread.ThreadWorker, name)
    }  # fmt: skip
    assert overrides == set(OVERRIDDEN)


def test_no_private_member_of_gunicorn_is_overridden() -> None:
    """A name gunicorn keeps to itself can change in any release without a word in its notes."""
    for cls, base in ((ScorerWorker, gthread.ThreadWorker), (FramedParser, RequestParser), (FramedRequest, Request)):
        private = {
            name for name in vars(cls)
            if name.startswith("_") and not name.startswith("__") and hasattr(base, name)
        }  # fmt: skip
        assert not private, f"{cls.__name__} overrides gunicorn's private {sorted(private)}"


def test_keeping_a_connection_alive_asks_the_parser_whether_its_body_is_drained() -> None:
    """``handle`` keeps a connection alive only if ``finish_body`` says nothing of the request
    is left on the socket: the framed parser says so, having read the body whole first."""
    assert "conn.parser.finish_body(" in inspect.getsource(gthread.ThreadWorker)
    assert _parameters(RequestParser.finish_body) == ["self", "deadline", "max_bytes"]
    assert _parameters(FramedParser.finish_body) == ["self", "deadline", "max_bytes"]


def test_the_stop_runs_through_murder_pending_in_both_loops() -> None:
    """The stop's cap on kept-alive connections is set from ``murder_pending``, which gunicorn
    calls in its main loop and in its graceful-shutdown loop."""
    assert _source("run").count("self.murder_pending()") >= 2


def test_a_finished_request_comes_back_to_the_main_loop_through_the_method_queue() -> None:
    """``finish_request`` runs on the main loop (it touches the poller and the deadline heap
    without a lock) only because gunicorn defers it through its method queue."""
    assert "self.method_queue.defer(self.finish_request, conn, fut)" in _source("enqueue_req")


def test_accept_hands_each_new_connection_to_enqueue_req() -> None:
    source = _source("accept")
    assert "self.enqueue_req(conn)" in source
    assert "self.nr_conns += 1" in source


def test_the_main_loop_dispatches_through_wait_for_and_dispatch_events() -> None:
    source = _source("run")
    assert "self.wait_for_and_dispatch_events(" in source
    assert "self.murder_pending()" in source


def test_the_attributes_the_worker_uses_are_set_by_gunicorn() -> None:
    """``poller`` and ``method_queue`` are set by gthread, ``nr_conns`` counted by it; the
    accept switch, the stop flag and the listeners come from the worker base."""
    init = inspect.getsource(gthread.ThreadWorker.__init__) + _source("init_process")
    for attribute in ("self.poller =", "self.method_queue =", "self.nr_conns ="):
        assert attribute in init
    assert callable(gthread.ThreadWorker.set_accept_enabled)
    assert _parameters(gthread.ThreadWorker.set_accept_enabled) == ["self", "enabled"]
    base = inspect.getsource(gthread.ThreadWorker.__mro__[1].__init__)
    for attribute in ("self.alive =", "self.sockets =", "self.cfg =", "self.log ="):
        assert attribute in base
    assert isinstance(gthread.STOP_KEEPALIVE_LINGER, (int, float))


def test_a_connection_has_the_fields_the_worker_sets_and_reads() -> None:
    init = inspect.getsource(gthread.TConn.__init__)
    for attribute in ("self.sock =", "self.client =", "self.parser =", "self.initialized ="):
        assert attribute in init
    assert "if self.initialized:" in inspect.getsource(gthread.TConn.init)


def test_the_parser_reads_the_framed_request_through_its_unreader_and_message_class() -> None:
    """``handle`` swaps the parser's unreader and message class for the framed ones."""
    assert _parameters(RequestParser.__init__) == ["self", "cfg", "source", "source_addr"]
    parser_source = inspect.getsource(RequestParser.__mro__[1])
    assert "self.mesg_class(" in parser_source and "self.unreader" in parser_source
    assert issubclass(FramedRequest, Request) and issubclass(FramedUnreader, Unreader)
    assert _parameters(Request.set_body_reader) == ["self"]
    assert _parameters(Unreader.chunk) == ["self", "size_hint"]
