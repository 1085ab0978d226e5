"""``rayjobs ui``: a history page over run records, served from this machine or written as static files.

``data.py`` turns records into what the pages show, ``log_pages.py`` reads a saved log a page at a time,
``pages.py`` makes the pages from ``templates/`` with the script and style of ``static/`` (plain HTML, CSS and
JavaScript files, no build step), ``server.py`` serves them with their JSON API, and ``export.py`` writes them
with their data for a browser to open from disk.
"""
