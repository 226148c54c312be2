"""The viewer outside the service: its page as one offline HTML file (``viewer.offline_page``).

The viewer's files live in ``service/static/`` (the service serves them at ``GET /``); this package reads them and
imports nothing of the service, the client or the engine, so that ``POST /trace/html`` (service/routes/trace.py)
and ``attention-trace --html`` / ``Trace.html()`` (attention_trace) write the same page without one shell
importing the other.
"""
