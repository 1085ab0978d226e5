"""Draw docs/ui-runs.png and docs/ui-run.png: `rayjobs ui`'s runs page and a run's page, as Chromium shows them.

    python docs/ui_screenshots.py LOCATION RUN [--out docs]

LOCATION is a folder of run records that real jobs wrote (``~/rayjobs-results`` after the quickstart), RUN the
run whose page is drawn (``quickstart``). `rayjobs ui` serves them in this process and Debian's headless
Chromium takes the pictures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.ui_browser import CHROMIUM, NO_CHROMIUM, screenshot, served  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("location", help="a folder of run records, local or s3://")
    parser.add_argument("run", help="the run whose page is drawn")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    if CHROMIUM is None:
        sys.exit(NO_CHROMIUM)
    with served(str(Path(args.location).expanduser())) as server:
        screenshot(server.url, args.out / "ui-runs.png", size="1400,560")
        screenshot(f"{server.url}run/{args.run}", args.out / "ui-run.png", size="1400,1800")
    print(f"wrote {args.out / 'ui-runs.png'} and {args.out / 'ui-run.png'}")


if __name__ == "__main__":
    main()
