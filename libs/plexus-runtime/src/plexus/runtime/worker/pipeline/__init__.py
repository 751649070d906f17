"""The message pipeline: what wraps the handling of one message, outermost first.

This docstring is the one place the order is written down (tests/runtime/test_architecture_doc.py checks
the handle chain against it):

    fencing → commit retry → handle → tracing → metrics → run control → retry → logging → deadline
    → app interceptors → the handler

- *Steps* (`_steps.MessageStep`) end a message with a `Settlement` (`_work.py`) that `Worker._settle`
  carries out: `Fencing` (`_fencing.py`), then `CommitRetry` (`_commit_retry.py`), then the worker's
  handling (``Worker._handle``: the activation, the handle chain, the commit, the reply). Core NATS work
  (a stateless type's) has no lease and no commit: its steps start at `CommitRetry`.
- The *handle chain* (`_chains.HandleChains`, chosen per message: a built-in with nothing to do for a
  message is left out of its chain) runs interceptors around the handler: `TracingInterceptor`
  (`plexus.runtime.interceptors`), `MetricsInterceptor` (`_metrics.py`), `RunControlInterceptor`
  (`_run_control.py`), `RetryInterceptor` (`_retry.py`), `LoggingInterceptor` (`_logging.py`),
  `DeadlineInterceptor` (`_deadline.py`), then the app's own.

Steps and interceptors are composed by one function, `compose` (`interceptors/_interceptors.py`). The
interceptor base class, its inputs and `TracingInterceptor` stay in `plexus.runtime.interceptors`, below the
client, whose send and publish chains use them too.
"""
