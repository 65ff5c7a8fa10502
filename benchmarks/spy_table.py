"""py-spy's raw output (recorded with --threads) as a table per thread: each function's share of the samples,
inclusive and self, then the functions with the most self samples.

    python3 benchmarks/spy_table.py spy.txt
"""

import collections
import re
import sys


def main() -> None:
    threads = collections.defaultdict(lambda: [collections.Counter(), collections.Counter(), 0])
    for line in open(sys.argv[1]):
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        thread = frames[0] if "thread" in frames[0] else "?"
        names = [re.sub(r" \((.*/)?([^/]*):\d+\)", r" (\2)", f) for f in frames[1:]]
        found = threads[thread]
        found[2] += int(count)
        for f in set(names):
            found[0][f] += int(count)
        if names:
            found[1][names[-1]] += int(count)
    for thread, (inclusive, own, total) in sorted(threads.items(), key=lambda t: -t[1][2]):
        if total < 50:
            continue
        print(f"== {thread}: {total} samples (inclusive %, self %)")
        for f, n in inclusive.most_common(45):
            print(f"{100 * n / total:5.1f} {100 * own[f] / total:5.1f}  {f[:150]}")
        print("-- most self samples")
        for f, n in own.most_common(25):
            print(f"{100 * n / total:5.1f}  {f[:150]}")


if __name__ == "__main__":
    main()
