"""The Python source the sandbox runs after a program: its tests one by one, or calls.

Kept as text and sent into the child (``run_python(call=...)``): they run in the
program's own namespace, under the bootstrap's limits.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CALLS_HARNESS", "MARK", "TEST_HARNESS"]

# Defined by the call expression after the program ran, so a program that ends with
# sys.exit() or shadows names still has its tests run. Every result goes to stderr as it
# comes, so a run killed by the deadline still tells which tests finished.
TEST_HARNESS: Final = r"""
def __refine_tests__(sources, per_test_s):
    import ast, inspect, json, reprlib, signal, sys, types

    VALUES_SHOWN = 4  # the code's values shown where a test failed

    class TestTimeout(BaseException):  # past `except Exception` in the code under test
        pass

    def alarm(signum, frame):
        raise TestTimeout()

    def short(value):
        text = repr(value)
        return text if len(text) <= 120 else text[:117] + "..."

    def report(message):
        sys.stderr.write("\n\x1erefine-test " + json.dumps(message) + "\n")
        sys.stderr.flush()

    brief = reprlib.Repr()
    brief.maxstring = brief.maxother = 60
    brief.maxlist = brief.maxtuple = brief.maxset = brief.maxdict = 8
    brief.maxlevel = 3

    nothing = object()

    def values(frame, skip=nothing):
        # The code's own values in a frame of it: its locals but the parameters (the
        # test shows the arguments), names starting with _, functions, classes, modules
        # and ``skip`` (the value returned, which the finding shows already).
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS)
        count += bool(code.co_flags & inspect.CO_VARKEYWORDS)
        params = code.co_varnames[:count]
        shown = []
        for name, value in list(frame.f_locals.items()):
            if name in params or name.startswith("_") or value is skip:
                continue
            try:
                if callable(value) or isinstance(value, types.ModuleType):
                    continue
                text = brief.repr(value)
            except BaseException:
                continue
            if " at 0x" not in text:  # an object shown by its address says nothing
                shown.append(f"{name} = {text}")
        text = ", ".join(shown[:VALUES_SHOWN])
        return text if len(text) <= 200 else text[:197] + "..."

    try:  # read once, before a test could change the directory
        with open("program.py", encoding="utf-8") as fh:
            program = fh.read().splitlines()
    except BaseException:
        program = []

    def code_line(number):
        # The line itself, unless it says no more than the error (a raise statement).
        line = program[number - 1].strip() if 0 < number <= len(program) else ""
        return f": `{line[:80]}`" if line and not line.startswith("raise") else ""

    def innermost(err, filename):
        # The traceback entry of the last frame in ``filename`` that ``err`` passed.
        tb, last = err.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                last = tb
            tb = tb.tb_next
        return last

    def raised_at(err):
        # Where in the code under test an error was raised, with the values there.
        last = innermost(err, "<program>")
        if last is None:
            return ""
        frame = last.tb_frame
        where = f"raised in {frame.f_code.co_name}, line {last.tb_lineno} of the code"
        shown = values(frame)
        return f" ({where}{code_line(last.tb_lineno)}" + (f", where {shown})" if shown else ")")

    def traced(expression, namespace):
        # Evaluate ``expression`` and keep where the first call into the code under test
        # returned, with its values there.
        seen = {}

        def local(frame, event, arg):
            if event == "return" and frame is seen.get("frame"):
                seen["at"] = (frame.f_code.co_name, frame.f_lineno, values(frame, arg))
            return local

        def calls(frame, event, arg):
            if "frame" not in seen and frame.f_code.co_filename == "<program>":
                seen["frame"] = frame
                frame.f_trace_lines = False  # its return is all that is wanted
                return local
            return None

        sys.settrace(calls)
        try:
            value = eval(expression, namespace)
        finally:
            sys.settrace(None)
        if "at" not in seen or not seen["at"][2]:
            return value, ""
        name, line, shown = seen["at"]
        return value, f"; {name} returned at line {line} of the code, where {shown}"

    def explain(source, err, namespace):
        at = innermost(err, "<test>")
        line = None if at is None else at.tb_lineno
        why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        why += raised_at(err)
        if line is None:
            return f"`{source.strip().splitlines()[-1][:200]}`: {why}"
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return why
        functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
        shown = source.splitlines()[line - 1].strip()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert):
                continue
            if not node.lineno <= line <= (node.end_lineno or node.lineno):
                continue
            shown = ast.get_source_segment(source, node) or shown
            test = node.test
            # `assert a == b` at top level: say what a is (inside a function its names
            # are gone)
            if isinstance(err, AssertionError) and isinstance(test, ast.Compare):
                if id(node) in inside:
                    continue
                left = ast.unparse(test.left)
                try:
                    expression = compile(ast.Expression(test.left), "<test>", "eval")
                    signal.setitimer(signal.ITIMER_REAL, per_test_s)
                    try:
                        value, returned = traced(expression, namespace)
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    why += f" ({left} is {short(value)}{returned})"
                except TestTimeout:
                    pass
                except BaseException as again:
                    why += f" ({left} raises {type(again).__name__})"
        return f"`{shown[:200]}`: {why}"

    namespace = globals()
    signal.signal(signal.SIGALRM, alarm)
    report("start")
    results = []
    for source in sources:
        error = None
        try:
            signal.setitimer(signal.ITIMER_REAL, per_test_s)
            try:
                exec(compile(source, "<test>", "exec"), namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except TestTimeout:
            last = [line.strip() for line in source.splitlines() if line.strip()][-1:] or [""]
            error = f"`{last[0][:200]}`: did not finish within {per_test_s:g} s"
        except SystemExit as err:  # unittest.main() ends this way
            if err.code not in (None, 0, False):
                error = f"SystemExit: {err.code}"
        except BaseException as err:
            error = explain(source, err, namespace)[:700]
        report(error)
        results.append(error)
    return len(results)
"""
MARK: Final = "\x1erefine-test "


# Each call's result as text: its repr (sets sorted, also inside lists, tuples and dicts,
# and memory addresses left out, so that two runs of the same code agree) and which of its
# arguments the call changed, or the name of the exception it raised, or "timeout".
CALLS_HARNESS: Final = r"""
def __refine_calls__(sources, per_call_s):
    import ast, re, signal

    class CallTimeout(BaseException):
        pass

    def alarm(signum, frame):
        raise CallTimeout()

    def shown(value, depth=0):
        # Sets at any depth of plain lists, tuples and dicts are sorted: the order a set
        # of strings iterates in changes with each process's hash seed.
        if depth > 20:
            return repr(value)
        if isinstance(value, set | frozenset):
            return type(value).__name__ + repr(sorted(shown(v, depth + 1) for v in value))
        if type(value) is list:
            return "[" + ", ".join(shown(v, depth + 1) for v in value) + "]"
        if type(value) is tuple:
            inner = ", ".join(shown(v, depth + 1) for v in value)
            return "(" + inner + ("," if len(value) == 1 else "") + ")"
        if type(value) is dict:
            items = (shown(k, depth + 1) + ": " + shown(v, depth + 1) for k, v in value.items())
            return "{" + ", ".join(items) + "}"
        return repr(value)

    def parts(source):
        # A call's function and positional arguments as sources, to see whether the call
        # changes them; None for anything else.
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(node, ast.Call) or any(
            isinstance(a, ast.Starred) for a in node.args
        ) or any(k.arg is None for k in node.keywords):
            return None
        keywords = [(k.arg, ast.unparse(k.value)) for k in node.keywords]
        return ast.unparse(node.func), [ast.unparse(a) for a in node.args], keywords

    RESULT_CHARS = 300  # of each call's result, kept

    def clean(text):
        # Memory addresses left out: two runs of the same code show the same text.
        return re.sub(r" at 0x[0-9a-fA-F]+", "", text)

    def run(source):
        split = parts(source)
        if split is None:
            return shown(eval(source, namespace)), ""
        function, sources, keywords = split
        fn = eval(function, namespace)
        args = [eval(a, namespace) for a in sources]
        kwargs = {k: eval(v, namespace) for k, v in keywords}
        before = [shown(a) for a in args]
        text = shown(fn(*args, **kwargs))
        changed = [str(i + 1) for i, a in enumerate(args) if shown(a) != before[i]]
        return text, " [argument " + ", ".join(changed) + " changed]" if changed else ""

    namespace = globals()
    signal.signal(signal.SIGALRM, alarm)
    results = []
    for source in sources:
        said = ""  # the arguments the call changed, said within RESULT_CHARS
        try:
            signal.setitimer(signal.ITIMER_REAL, per_call_s)
            try:
                text, said = run(source)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CallTimeout:
            text = "timeout"
        except BaseException as err:
            # An error class of the code's own is shown with its built-in base: the
            # request may name the base ("raises RomanError(ValueError)").
            raised = type(err)
            base = next((c for c in raised.__mro__ if c.__module__ == "builtins"), raised)
            shown_base = "" if base is raised else "(" + base.__name__ + ")"
            text = "raises " + raised.__name__ + shown_base
        results.append(clean(text)[: RESULT_CHARS - len(said)] + said)
    return results
"""
