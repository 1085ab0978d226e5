"""``rayjobs ui --export DIR``: the same pages as files, their data inside them, to open from disk or keep as a
CI artifact.

``DIR/index.html`` (the runs), ``DIR/run/NAME.html`` (each run), ``DIR/compare.html?run=A&run=B`` (any of them side
by side), ``DIR/pipeline/RUN.html`` (each pipeline run's graph), ``DIR/run/NAME/log-SUBMISSION-N.txt`` (each log's
pages, masked, as the served page shows them) and ``DIR/static/`` (the pages' script and style, the files the server
serves).
"""

from __future__ import annotations

import time
from pathlib import Path

from runner.errors import RayJobsError
from runner.ui import data, pages
from runner.ui.log_pages import log_page


def export(records: data.Records, target: Path) -> dict[str, int]:
    """Write every page of ``records`` under ``target``; returns how many runs, pages and log pages were written.

    A run whose record cannot be read is listed (as the runs page lists it) and gets no page of its own.
    """
    now = time.time()
    table = data.runs_table(records, now)
    target.mkdir(parents=True, exist_ok=True)
    (target / "run").mkdir(exist_ok=True)
    compared, written, log_files = [], 0, 0
    for row in table["runs"]:
        name = row["run"]
        try:
            detail = data.run_detail(records, name, now)
        except RayJobsError:
            continue
        page = pages.run_page(name, embedded=detail, base="../")
        (target / "run" / f"{name}.html").write_text(page, encoding="utf-8")
        written += 1
        folder = records.folder(name)
        logs = target / "run" / name
        for log in detail["logs"]:
            logs.mkdir(exist_ok=True)
            for page in range(log["pages"]):
                text = log_page(folder, log["submission_id"], page)["text"]
                (logs / f"log-{log['submission_id']}-{page + 1}.txt").write_text(text, encoding="utf-8")
                log_files += 1
        compared.append({key: detail[key] for key in (*row, "reports")})
    for run_id in data.pipeline_runs(table["runs"]):
        (target / "pipeline").mkdir(exist_ok=True)
        page = pages.pipeline_page(run_id, embedded=data.pipeline_detail(records, run_id), base="../")
        (target / "pipeline" / f"{run_id}.html").write_text(page, encoding="utf-8")
    (target / pages.STATIC_FOLDER).mkdir(exist_ok=True)
    for name in pages.static_files():
        (target / pages.STATIC_FOLDER / name).write_bytes(pages.static_file(name))
    (target / "index.html").write_text(pages.runs_page(embedded=table), encoding="utf-8")
    (target / "compare.html").write_text(pages.compare_page(embedded={"runs": compared}), encoding="utf-8")
    return {"runs": len(table["runs"]), "run_pages": written, "log_pages": log_files}
