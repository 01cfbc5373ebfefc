#!/usr/bin/env python3
"""Compiles and runs the code blocks of the README and docs/ that are marked as examples.

A block is an example when the line before its fence is a marker:

    <!-- example: NAME pkg: idem -->       a ```cpp block: compiled against the pkg-config modules
                                           named after pkg: (default idem) and run in a fresh directory
    <!-- example: NAME shell -->           a ```sh block: run by bash -eo pipefail in a fresh directory,
                                           with the `idem` binary and every compiled example on PATH
    <!-- output: NAME -->                  a ```text block: what example NAME must print on stdout

    examples.py --bin DIR [--work DIR] FILE.md...

DIR holds the built `idem` binary. pkg-config must find the installed library (tests/embedding/run
points it at a `meson install --destdir`). A failure names the file, the line of the block and the
cause, and exits 1.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

MARKER = re.compile(r"^<!-- (example|output): ([A-Za-z0-9_.-]+)(.*?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
LANGUAGES = {"cpp": "cpp", "sh": "shell", "text": "output"}


class Failure(Exception):
    pass


def blocks(path):
    """Yields (kind, name, options, line, text) for each marked block of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        kind, name, rest = m.group(1), m.group(2), m.group(3).strip()
        where = f"{path}:{i + 1}"
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not fence:
            raise Failure(f"{where}: the marker of '{name}' is not followed by a ``` fence on the next line")
        lang = fence.group(1)
        if kind == "output":
            if lang != "text":
                raise Failure(f"{where}: the output of '{name}' must be a ```text block, not ```{lang}")
            mode = "output"
        elif rest == "shell":
            if lang != "sh":
                raise Failure(f"{where}: the shell example '{name}' must be a ```sh block, not ```{lang}")
            mode = "shell"
        else:
            if lang != "cpp":
                raise Failure(f"{where}: the example '{name}' must be a ```cpp block (or marked shell), not ```{lang}")
            if rest and not rest.startswith("pkg:"):
                raise Failure(f"{where}: the example '{name}' has '{rest}' where 'pkg: MODULE...' or 'shell' was expected")
            mode = "cpp"
        end = i + 2
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise Failure(f"{where}: the block of '{name}' has no closing ``` fence")
        modules = rest[len("pkg:"):].split() if mode == "cpp" and rest else ["idem"]
        yield mode, name, modules, where, "\n".join(lines[i + 2:end]) + "\n"
        i = end + 1


def run(cmd, cwd, env, where, what, timeout=120):
    """Runs cmd in a process group of its own, which is killed once cmd ends: a server an example
    started in the background and did not stop (it failed half-way) does not outlive it."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode == -signal.SIGKILL:
        raise Failure(f"{where}: {what} did not finish within {timeout} s:\n{stdout}{stderr}")
    if p.returncode != 0:
        raise Failure(f"{where}: {what} failed with exit status {p.returncode}:\n{stdout}{stderr}")
    return stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the directory of the built idem binary")
    ap.add_argument("--work", help="where the examples are built (default: a temporary directory)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    examples, outputs = [], {}
    try:
        for path in args.files:
            for mode, name, modules, where, text in blocks(path):
                if mode == "output":
                    if name in outputs:
                        raise Failure(f"{where}: a second output block for '{name}' ({outputs[name][0]} has one)")
                    outputs[name] = (where, text)
                else:
                    if any(e[1] == name for e in examples):
                        raise Failure(f"{where}: a second example named '{name}'")
                    examples.append((mode, name, modules, where, text))
        names = {e[1] for e in examples}
        for name, (where, _) in outputs.items():
            if name not in names:
                raise Failure(f"{where}: an output block for '{name}', which is no example")
        if not examples:
            raise Failure(f"no marked example in {' '.join(args.files)}")

        work = args.work or tempfile.mkdtemp(prefix="idem-examples-")
        os.makedirs(work, exist_ok=True)
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir, exist_ok=True)
        env = dict(os.environ)
        env["PATH"] = f"{bindir}:{os.path.abspath(args.bin)}:{env.get('PATH', '')}"
        cxx = os.environ.get("CXX", "c++")

        # The C++ examples are compiled first, two at a time (the shell examples may run them).
        def build(example):
            _, name, modules, where, text = example
            source = os.path.join(work, f"{name}.cpp")
            path, line = where.rsplit(":", 1)
            with open(source, "w", encoding="utf-8") as f:
                # The compiler's messages name the Markdown file and its lines.
                f.write(f'#line {int(line) + 2} "{os.path.abspath(path)}"\n' + text)
            flags = run(["pkg-config", "--cflags", "--libs", *modules], work, env, where,
                        f"pkg-config {' '.join(modules)} (for example '{name}')").split()
            run([cxx, "-std=c++20", "-O0", "-Wall", "-Werror", source, "-o", os.path.join(bindir, name), *flags],
                work, env, where, f"compiling example '{name}' against the installed {' '.join(modules)}", timeout=300)

        programs = [e for e in examples if e[0] == "cpp"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for done in [pool.submit(build, e) for e in programs]:
                done.result()  # the first failure, in the order of the files

        # The commands this `idem` has: JetStream and HTTP are optional features of a build, and a
        # shell example that needs a command the build left out is skipped, saying so.
        help_text = run([os.path.join(args.bin, "idem"), "--help"], work, env, args.bin, "idem --help")
        commands = set(re.findall(r"^  ([a-z-]+)\s", help_text.split("commands:", 1)[-1], re.M))

        # Then each example runs, in the order they appear: programs first.
        for mode, name, modules, where, text in programs + [e for e in examples if e[0] == "shell"]:
            missing = sorted(set(re.findall(r"(?:^|[\s;&|(])idem ([a-z-]+)", text)) - commands) if mode == "shell" else []
            if missing:
                print(f"example {name} ({where}): skipped, this build's idem has no {', '.join(missing)}")
                continue
            rundir = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
            if mode == "cpp":
                out = run([os.path.join(bindir, name)], rundir, env, where, f"example '{name}'")
            else:
                script = os.path.join(work, f"{name}.sh")
                with open(script, "w", encoding="utf-8") as f:
                    f.write(text)
                out = run(["bash", "-eo", "pipefail", script], rundir, env, where, f"shell example '{name}'")
            if name in outputs:
                owhere, expected = outputs[name]
                if out != expected:
                    raise Failure(f"{owhere}: example '{name}' ({where}) printed what its output block does not say\n"
                                  f"--- expected\n{expected}--- got\n{out}")
            print(f"example {name} ({where}): ok{', output as documented' if name in outputs else ''}")
            shutil.rmtree(rundir, ignore_errors=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    except Failure as f:
        print(f"examples: {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
