"""``rayjobs ui`` over real HTTP on 127.0.0.1 against hostile requests and hostile records: a forged ``Host`` (DNS
rebinding), another site's ``Origin``, tokens that are not ASCII, two servers on one machine, records whose
submission id is a path or whose fields hold the wrong types, names in the URL that are paths, and the static
files. Requests go through ``http.client``, which sends the headers as given."""

from __future__ import annotations

import http.client
import json
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from rayjobs_agent.record_layout import log_folder
from tests.support.ui_browser import served
from tests.test_record_reading import GOOD, GOOD_ATTEMPT, WRONG_TYPES, with_changes, write_run

OUTSIDE_TEXT = "the contents of a file outside the records"


def request(server: Any, path: str, headers: dict[str, Any] | None = None, host: str | bytes | None = "own"
            ) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` from ``server`` with exactly ``headers``; ``host``: the Host header (``"own"``: the address
    it listens on, None: none at all)."""
    port = server.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            connection.putheader("Host", f"127.0.0.1:{port}" if host == "own" else host)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, {name.lower(): value for name, value in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def strict_json(body: bytes) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in an answer: a browser's JSON.parse refuses it")

    return json.loads(body, parse_constant=refuse)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """A good run; one whose submission id leads to a folder outside the records; one whose log part is a link
    to a file outside."""
    root = tmp_path_factory.mktemp("ui-security")
    outside = root / "outside"
    (outside / "logs").mkdir(parents=True)
    (outside / "logs" / "00000.log").write_text(OUTSIDE_TEXT + "\n")
    records = root / "records"
    write_run(records, "good", GOOD)
    escape = f"../../../{'../' * len(records.parts)}{str(outside / 'logs').lstrip('/')}"
    escaping = write_run(records, "escape", with_changes(started=900.0,
                                                        attempts=[{**GOOD_ATTEMPT, "submission_id": escape}]))
    (escaping / log_folder("x")).parent.mkdir(parents=True)  # as an earlier attempt's log leaves it
    linked = write_run(records, "linked", with_changes(name="linked"))
    part = linked / log_folder("raysubmit_good") / "00000.log"
    part.unlink()
    part.symlink_to(outside / "logs" / "00000.log")
    return records


@pytest.fixture(scope="module")
def wrong_records(tmp_path_factory) -> Path:
    """A good run; one run of each wrong type, of the same name and earlier, so that the good run's page compares
    itself with each of them; one whose metric diverged to NaN."""
    records = tmp_path_factory.mktemp("ui-wrong-types")
    write_run(records, "good", GOOD)
    for index, (changes, _) in enumerate(WRONG_TYPES):
        write_run(records, f"wrong-{index}", with_changes(**{"started": 500.0 + index, **changes}))
    write_run(records, "diverged", with_changes(name="diverged", metrics={"loss": float("nan")}))
    return records


@pytest.fixture(scope="module")
def server(records) -> Any:
    """``rayjobs ui`` over ``records`` on 127.0.0.1, for the module."""
    with served(str(records)) as running:
        yield running


@pytest.fixture(scope="module")
def token_server(records) -> Any:
    """``rayjobs ui`` over ``records`` on every address, so with a token, for the module."""
    with served(str(records), host="0.0.0.0") as running:
        yield running


# ----------------------------------------------------------------- Host: DNS rebinding

@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}", "127.0.0.1.attacker.example",
                                  "localhost.attacker.example:{port}", "[::2]:{port}", "", "bad host:{port}", None])
def test_a_host_header_that_names_another_site_is_refused_on_every_route(server, host):
    port = server.server_address[1]
    forged = None if host is None else host.format(port=port)
    for path in ("/", "/api/runs", "/api/run/good", "/run/good", "/static/app.js", "/api/search?q=step"):
        status, _, body = request(server, path, host=forged)
        assert status == 403, (path, forged, status)
        assert b"raysubmit" not in body and b"study" not in body


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LOCALHOST", "[::1]:{port}",
                                  "[::1]", "localhost:9999"])
def test_the_names_of_this_machine_on_loopback_are_answered_with_or_without_a_port(server, host):
    # A port other than the server's: an ssh tunnel (ssh -L 9999:localhost:8270) keeps the browser's.
    status, _, body = request(server, "/api/runs", host=host.format(port=server.server_address[1]))
    assert status == 200 and {row["run"] for row in strict_json(body)["runs"]} >= {"good", "escape"}


def test_off_loopback_the_machine_s_names_are_answered_and_another_site_s_is_refused_even_with_the_token(
        token_server):
    bearer = {"Authorization": f"Bearer {token_server.token}"}
    port = token_server.server_address[1]
    assert request(token_server, "/api/runs", bearer, host=f"{socket.gethostname()}:{port}")[0] == 200
    assert request(token_server, "/api/runs", bearer, host=f"0.0.0.0:{port}")[0] == 200
    assert request(token_server, "/api/runs", bearer, host=f"localhost:{port}")[0] == 200
    assert request(token_server, "/api/runs", bearer, host=f"attacker.example:{port}")[0] == 403


# ----------------------------------------------------------------- Origin: another site's page

def test_the_api_refuses_a_request_from_another_site_s_page_and_answers_its_own(server):
    own = f"http://127.0.0.1:{server.server_address[1]}"
    for origin in ("http://attacker.example", "null", f"https://127.0.0.1:{server.server_address[1]}",
                   "http://127.0.0.1:1"):
        assert request(server, "/api/runs", {"Origin": origin})[0] == 403, origin
        assert request(server, "/api/run/good/log?q=step", {"Origin": origin})[0] == 403, origin
    assert request(server, "/api/runs", {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert request(server, "/api/runs", {"Sec-Fetch-Site": "same-site"})[0] == 403
    assert request(server, "/api/runs", {"Origin": own, "Sec-Fetch-Site": "same-origin"})[0] == 200
    assert request(server, "/api/runs", {"Sec-Fetch-Site": "none"})[0] == 200
    assert request(server, "/api/runs")[0] == 200, "a script sends no Origin"
    # A link from another site to a page is fine: the page itself holds no data.
    assert request(server, "/run/good", {"Sec-Fetch-Site": "cross-site"})[0] == 200


# ----------------------------------------------------------------- the token

@pytest.mark.parametrize("where", ["query", "header", "cookie"])
@pytest.mark.parametrize("given", ["é", "tökén", "\u2603" * 40, "\udcff"])
def test_a_token_that_is_not_ascii_is_a_clean_401_wherever_it_comes(token_server, where, given):
    raw = given.encode("utf-8", "surrogatepass")
    if where == "query":
        from urllib.parse import quote_from_bytes

        status, _, _ = request(token_server, f"/api/runs?token={quote_from_bytes(raw)}")
    elif where == "header":
        status, _, _ = request(token_server, "/api/runs", {"Authorization": b"Bearer " + raw})
    else:
        port = token_server.server_address[1]
        status, _, _ = request(token_server, "/api/runs", {"Cookie": b"rayjobs_ui_token=" + raw
                                                           + f"; rayjobs_ui_token_{port}=".encode() + raw})
    assert status == 401
    assert request(token_server, "/api/runs", {"Authorization": f"Bearer {token_server.token}"})[0] == 200


def test_the_token_s_cookie_is_named_for_its_port_so_two_servers_on_one_machine_keep_their_own(records):
    with ExitStack() as stack:
        first, second = (stack.enter_context(served(str(records), host="0.0.0.0")) for _ in range(2))
        cookies = {}
        for server in (first, second):
            status, headers, _ = request(server, f"/?token={server.token}")
            assert status == 200
            name, _, value = headers["set-cookie"].split(";")[0].partition("=")
            assert name == f"rayjobs_ui_token_{server.server_address[1]}" and value == server.token
            cookies[server] = f"{name}={value}"
        both = f"{cookies[first]}; {cookies[second]}; other=x"
        assert request(first, "/api/runs", {"Cookie": both})[0] == 200
        assert request(second, "/api/runs", {"Cookie": both})[0] == 200
        assert request(first, "/api/runs", {"Cookie": cookies[second]})[0] == 401
        assert request(first, "/api/runs", {"Cookie": f"rayjobs_ui_token={first.token}"})[0] == 401


# ----------------------------------------------------------------- records that name paths

def test_a_record_whose_submission_id_is_a_path_serves_nothing_outside_the_records(server):
    _, _, runs = request(server, "/api/runs")
    rows = {row["run"]: row for row in strict_json(runs)["runs"]}
    page = request(server, "/api/run/escape")
    log = request(server, "/api/run/escape/log")
    searched_log = request(server, "/api/run/escape/log?q=outside")
    search = request(server, "/api/search?q=outside")
    linked = request(server, "/api/run/linked")
    linked_log = request(server, "/api/run/linked/log")
    linked_search = request(server, "/api/run/linked/log?q=outside")
    for answer in (page, log, searched_log, search, linked, linked_log, linked_search):
        assert OUTSIDE_TEXT.encode() not in answer[2]
    assert rows["escape"]["status"] == "UNREADABLE" and "submission_id" in rows["escape"]["error"]
    assert [page[0], log[0], searched_log[0]] == [400, 400, 400]
    assert search[0] == 200 and strict_json(search[2])["matches"] == []
    assert {skipped["run"] for skipped in strict_json(search[2])["skipped"]} == {"linked"}
    assert [linked[0], linked_log[0], linked_search[0]] == [400, 400, 400]
    assert b"leads out of" in linked[2]


def test_a_run_folder_that_is_a_link_out_of_the_records_is_listed_unreadable_and_serves_nothing(tmp_path):
    # Whoever can write into a shared records folder can leave a link there to any folder holding a run.json.
    outside_run = write_run(tmp_path / "elsewhere", "theirs", GOOD)
    (outside_run / log_folder("raysubmit_good") / "00000.log").write_text(OUTSIDE_TEXT + "\n")
    records = tmp_path / "records"
    write_run(records, "good", GOOD)
    (records / "linkrun").symlink_to(outside_run, target_is_directory=True)
    with served(str(records)) as server:
        rows = {row["run"]: row for row in strict_json(request(server, "/api/runs")[2])["runs"]}
        answers = [request(server, path) for path in ("/api/run/linkrun", "/api/run/linkrun/log",
                                                       "/api/run/linkrun/log?q=OUTSIDE", "/api/search?q=OUTSIDE")]
    assert rows["linkrun"]["status"] == "UNREADABLE" and "leads out of" in rows["linkrun"]["error"]
    assert rows["good"]["status"] != "UNREADABLE"
    assert [answer[0] for answer in answers[:3]] == [400, 400, 400]
    assert answers[3][0] == 200 and strict_json(answers[3][2])["matches"] == []
    for answer in answers:
        assert OUTSIDE_TEXT.encode() not in answer[2]


@pytest.mark.parametrize("name", ["..", "..%2F..%2Fetc", "%2E%2E", "a%5Cb", "%00", "a%2Fb", "good%00"])
def test_a_run_name_in_the_url_that_is_a_path_is_a_400(server, name):
    for path in (f"/api/run/{name}", f"/api/run/{name}/log", f"/api/run/{name}/log?q=root",
                 f"/api/compare?run={name}&run=good"):
        status, _, body = request(server, path)
        assert status == 400, (path, status)
        assert "no run's name" in strict_json(body)["error"]


# ----------------------------------------------------------------- records of the wrong types

def test_records_of_the_wrong_types_are_listed_unreadable_and_every_other_page_still_answers(wrong_records):
    with served(str(wrong_records)) as server:
        _records_of_the_wrong_types(server)


def _records_of_the_wrong_types(server: Any) -> None:
    status, _, body = request(server, "/api/runs")
    rows = {row["run"]: row for row in strict_json(body)["runs"]}
    good = request(server, "/api/run/good")
    wrong = [request(server, f"/api/run/wrong-{index}") for index in range(len(WRONG_TYPES))]
    search = request(server, "/api/search?q=step")
    compared = request(server, "/api/compare?run=good&run=diverged")
    diverged = request(server, "/api/run/diverged")
    assert status == 200
    for index, (_, reason) in enumerate(WRONG_TYPES):
        assert rows[f"wrong-{index}"]["status"] == "UNREADABLE" and reason in rows[f"wrong-{index}"]["error"]
        assert wrong[index][0] == 400 and reason in strict_json(wrong[index][2])["error"]
    assert good[0] == 200 and strict_json(good[2])["previous"] is None
    assert search[0] == 200 and {hit["run"] for hit in strict_json(search[2])["matches"]} >= {"good"}
    assert compared[0] == 200 and diverged[0] == 200
    assert strict_json(diverged[2])["metrics"] == {"loss": "NaN"}


# ----------------------------------------------------------------- the static files

def test_the_script_and_style_are_served_with_their_types_and_nothing_else_from_their_folder(server):
    script = request(server, "/static/app.js")
    style = request(server, "/static/app.css")
    refused = [request(server, path)[0] for path in (
        "/static/", "/static/..%2Fserver.py", "/static/../server.py", "/static/%2E%2E/pages.py",
        "/static/app.js/x", "/static/nothing.js", "/static/..%2Ftemplates%2Fpage.html", "/static/%00")]
    assert script[0] == 200 and script[1]["content-type"] == "text/javascript; charset=utf-8"
    assert style[0] == 200 and style[1]["content-type"] == "text/css; charset=utf-8"
    assert script[1]["x-content-type-options"] == "nosniff" and b"addEventListener" in script[2]
    assert refused == [404] * len(refused)


def test_the_static_files_are_found_through_the_installed_package():
    from importlib import resources

    from runner.ui import pages

    shipped = {entry.name for entry in resources.files("runner.ui").joinpath("static").iterdir()}
    assert {"app.js", "app.css"} <= shipped and set(pages.static_files()) == {"app.js", "app.css"}
    assert {entry.name for entry in resources.files("runner.ui").joinpath("templates").iterdir()} == {
        "page.html", "runs.html", "run.html", "compare.html", "pipeline.html"}
