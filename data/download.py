"""Fetch the nine CS224N multitask CSV files from the course's starter repository.

    python -m data.download [--dest DIR] [--force] [--base-url URL]

The files come from the default final project's GitHub repository, pinned to one commit so
that every download is the same bytes. Each file is written to a temporary name and renamed
into place only once complete and readable by data.loaders, so an interrupted download never
leaves a truncated CSV that looks finished. Only the standard library is used.
"""
from __future__ import annotations

import argparse
import http.client
import logging
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .folder import data_folder
from .loaders import COURSE_FILES, DataError, load_task_file

logger = logging.getLogger(__name__)

REPO = "gpoesia/minbert-default-final-project"
COMMIT = "571f43439d622b9443b984b09b1ee439b7f873df"
BASE_URL = f"https://raw.githubusercontent.com/{REPO}/{COMMIT}/data/"
TIMEOUT_S = 60
PROG = "python -m data.download"
_LFS_POINTER = b"version https://git-lfs"


class DownloadError(RuntimeError):
    pass


def _fetch(url: str, dest: Path, task: str, labelled: bool) -> None:
    """Download url to dest atomically; raise DownloadError (and leave nothing) on failure."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            shutil.copyfileobj(resp, out, length=1 << 20)
        with tmp.open("rb") as f:
            if f.read(len(_LFS_POINTER)) == _LFS_POINTER:
                raise DownloadError(f"{url} is a Git LFS pointer, not the data; fetch the file "
                                    "with `git lfs pull` from a clone of the repository instead")
        try:  # a proxy's HTML error page must not pass for a CSV
            res = load_task_file(tmp, task, labelled=labelled, log=False)
        except DataError as e:
            msg = str(e).replace(str(tmp), dest.name)  # the temporary name means nothing to the user
            raise DownloadError(f"{url} did not give a readable {task} file: {msg}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it owner-only; a shared data folder needs the usual mode
        os.replace(tmp, dest)
        if res.bad_rows:  # the course files have a few; the trainer skips and reports them again
            logger.warning("%s: %d bad row(s) the loader will skip, the first on line %d: %s", dest,
                           len(res.bad_rows), res.bad_rows[0].line, res.bad_rows[0].reason)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # offline, 404, cut short, disk full
        reason = getattr(e, "reason", None) or e
        raise DownloadError(f"could not download {url}: {reason}") from e
    finally:
        tmp.unlink(missing_ok=True)


def download(dest: Path, *, force: bool = False, base_url: str = BASE_URL) -> list[Path]:
    """Fetch every course file missing from dest (all of them with force); return those written."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create {dest}: {e}") from e
    written = []
    for task, splits in COURSE_FILES.items():
        for split, name in splits.items():
            target = dest / name
            if target.exists() and not force:
                print(f"{target}: already present, skipping (--force to fetch it again)")
                continue
            url = base_url.rstrip("/") + "/" + name
            print(f"fetching {url} -> {target}")
            _fetch(url, target, task, labelled=split != "test")
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    names = [n for splits in COURSE_FILES.values() for n in splits.values()]
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Download the CS224N multitask data (SST-5, Quora, STS-B): "
                    + ", ".join(names) + ".",
        epilog="Without internet, put those files in a folder by hand and set MINBERT_DATA_DIR to it "
               "(or pass --data-dir to each command).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False)  # a prefix of a flag is refused, as by every command
    parser.add_argument("--dest", type=Path, default=Path(data_folder()),
                        help="folder to write the CSV files into (created if missing): $MINBERT_DATA_DIR if set, "
                             "else data, the folder every command reads by default")
    parser.add_argument("--force", action="store_true",
                        help="download files again even when they are already in DEST")
    parser.add_argument("--base-url", default=BASE_URL,
                        help="URL of the folder holding the files (a mirror, or another commit)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        written = download(args.dest, force=args.force, base_url=args.base_url)
    except DownloadError as e:
        # one line; offline, the way on is the one every command reads: the files in a folder it names
        print(f"{PROG}: error: {e}; no partial file was left. Offline? Put the course files ({', '.join(names)}) "
              f"by hand into {args.dest}, or into any folder and set MINBERT_DATA_DIR to it (or pass --data-dir)",
              file=sys.stderr)
        return 1
    print(f"done: {len(written)} file(s) downloaded into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
