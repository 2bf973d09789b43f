"""Command line: ``python -m cropcop_utils book --data synthetic|PATH [--field synthetic|PATH]
[--field-train PATH] [--review-verdicts PATH] --profile NAME --run-dir DIR``."""

from __future__ import annotations

import argparse
import sys

from .core.config import SYNTHETIC, available_profiles


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cropcop_utils", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    book = commands.add_parser("book", help="execute the chapter notebooks and render the book")
    book.add_argument("--data", default=SYNTHETIC,
                      help="'synthetic' (the embedded corpus) or an image-folder corpus: "
                           "PATH/<class>/<images> or PATH/{train,val,test}/<class>/<images>")
    book.add_argument("--field", default=None, action="append",
                      help="field cohort for chapter 10: [SOURCE=]PATH/<lab class>/<images> (optional "
                           "labels.csv and masks/<class>/<stem>.png) or 'synthetic'; give it again for more "
                           "cohorts, each scored and shown apart (the first one is primary: attribution, "
                           "swaps, the learning curve, chapter 11's fit); SOURCE names where the photos come "
                           "from, so a cohort from --field-train's source reads as in-source and another as "
                           "cross-source; default: what the run folder recorded, else 'synthetic' with "
                           "--data synthetic and none with a real corpus")
    book.add_argument("--field-train", default=None,
                      help="labelled field photos to train and select on: [SOURCE=]PATH/<lab class>/<images> "
                           "(optional labels.csv); scanned in chapter 1, grouped with the lab corpus and "
                           "the field cohort in chapter 2, split into train/val in chapter 3; default: what "
                           "the run folder recorded, else none")
    book.add_argument("--review-verdicts", default=None, metavar="PATH",
                      help="a filled-in audit/review.csv (verdict same / different / blank per pair): "
                           "chapter 2 trusts the pairs judged same before forming the leakage groups, so "
                           "chapter 3 keeps them on one side of the split (audit.review_verdicts); default: "
                           "what the run folder recorded, else none")
    book.add_argument("--profile", default="default", help=f"one of {', '.join(available_profiles())} "
                      "or a path to a profile YAML")
    book.add_argument("--run-dir", default=None, help="run folder (default: runs/<profile>)")
    book.add_argument("--until", default=None, help="run the chain only up to this chapter (e.g. audit)")
    book.add_argument("--force", action="store_true",
                      help="run every chapter, even those whose code, parameters and inputs are unchanged")
    book.add_argument("--no-html", action="store_true", help="execute the notebooks but skip the HTML build")
    explore = commands.add_parser("explore", help="serve the error explorer on a run folder (127.0.0.1)")
    explore.add_argument("--run-dir", required=True, help="a run folder that reached training or later")
    explore.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    explore.add_argument("--state", default=None, help="state shown first (default: the last)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "explore":
        from .explorer.app import serve

        try:
            return serve(args.run_dir, port=args.port, state=args.state)
        except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    from .book import ChapterFailed, run_book

    run_dir = args.run_dir or f"runs/{args.profile}"
    try:
        run_book(run_dir, profile=args.profile, data=args.data, field=args.field,
                 field_train=args.field_train, until=args.until, html=not args.no_html, force=args.force,
                 log=lambda line: print(line, flush=True), review_verdicts=args.review_verdicts)
    except ChapterFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
