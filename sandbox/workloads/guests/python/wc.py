"""The guest example in Python: counts the lines, words and bytes of /input/input.txt, writes them to
/output/summary.txt and prints one line (the same task and output as every language in
docs/guests.md). Run as a job with `e31 submit --python wc.py --input input.txt`: it runs in the
CPython 3.12 WASI interpreter that e31-node[python] installs (TOOLCHAIN beside this file)."""

import sys


def main() -> int:
    try:
        with open("/input/input.txt", "rb") as f:
            text = f.read()
    except OSError as e:
        print(f"/input/input.txt: {e.strerror}", file=sys.stderr)
        return 1
    lines = text.count(b"\n")
    words = len(text.split())  # bytes.split() splits on space, \t, \n, \v, \f, \r: as wc does
    with open("/output/summary.txt", "w") as out:
        out.write(f"lines {lines}\nwords {words}\nbytes {len(text)}\n")
    print(f"python: {lines} lines, {words} words, {len(text)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
