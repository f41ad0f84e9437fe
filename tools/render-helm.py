#!/usr/bin/env python3
"""Renders a Helm chart that keeps to a small subset of Helm's template language, exactly as Helm would.

There is no helm binary in Debian; Tessera's chart (deploy/helm/tessera) is written in this subset so that CI can
render it with its default values and validate the result (tools/validate-manifests.py). Anything outside the
subset is refused with an error naming the file, the line and the action, never guessed at.

The subset (Go text/template as Helm 3 runs it):
  {{ .Values.a.b }}              a value from values.yaml (merged with --values/--set/--set-file)
  {{ .Release.Name }}            the release name (--name, default "tessera")
  {{ .Release.Namespace }}       the release namespace (--namespace, default "tessera-system")
  {{ X | quote }}                X in double quotes, escaped as Go's %q does (sprig's quote)
  {{ if X }} ... {{ else }} ... {{ end }}   Go template truth: false, 0, null, "", [] and {} are false
  {{/* comment */}}
  {{- and -}}                    trim the white space (spaces, tabs, newlines) before / after the action

Where this renderer is stricter than Helm (it refuses rather than renders):
  - printing a value that is missing or null (Helm prints an empty string), or a map or a list (Helm prints
    Go's map[...] form): both are mistakes in a manifest;
  - templates whose name starts with "_" (partials: define/include are not in the subset);
  - --set values with ",", "[", "{" or "\\" (Helm's full --set syntax is not implemented).
Numbers from values files print as Helm prints them: Helm reads values.yaml through JSON, so every number is a
float64 and prints with Go's %v (1000000 -> 1e+06); numbers given with --set are integers (int64).
Output: the rendered templates in file-name order, each after "---" and "# Source: CHART/templates/FILE"
(helm template sorts by kind instead; the objects are the same).

  tools/render-helm.py deploy/helm/tessera
  tools/render-helm.py deploy/helm/tessera --namespace gpu --set scheduler.replicas=3 \\
      --set-file webhook.caBundle=deploy/scheduler/tls/ca-bundle.b64
"""

import argparse
import decimal
import os
import re
import sys

import yaml


class RenderError(Exception):
    """A template or value outside the subset, or a value that cannot be printed."""


_ACTION = re.compile(r"\{\{(- )?(.*?)( -)?\}\}", re.S)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_FIELD_CHAIN = re.compile(rf"^\.(Values(?:\.{_IDENT})+|Release\.(?:Name|Namespace))$")
_WS = " \t\r\n"


def go_float(x):
    """Go's fmt %v of a float64, as Helm prints numbers from values files: %g with the shortest digits, so the
    exponent form when the decimal exponent is < -4 or >= 6 (strconv/ftoa.go: "if precision was the shortest
    possible, use precision 6 for this decision"): 100000 -> 100000, 1000000 -> 1e+06, 0.5 -> 0.5."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if str(x).startswith("-") else "0"
    d = decimal.Decimal(repr(float(x)))
    sign, digits, exponent = d.as_tuple()
    digits = "".join(map(str, digits)).rstrip("0") or "0"
    # decimal exponent of the first digit
    exp = len(d.as_tuple().digits) + exponent - 1
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        out = f"{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    elif exp >= len(digits) - 1:
        out = digits + "0" * (exp - len(digits) + 1)
    elif exp >= 0:
        out = digits[: exp + 1] + "." + digits[exp + 1 :]
    else:
        out = "0." + "0" * (-exp - 1) + digits
    return ("-" if sign else "") + out


def go_quote(s):
    """strconv.Quote: Go's %q of a string."""
    named = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    out = ['"']
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in named:
            out.append(named[ch])
        elif ch == " " or (ch.isprintable() and not ch.isspace()):
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


class Value:
    """A value with where it came from: numbers from YAML are float64 in Helm, from --set int64."""

    def __init__(self, raw, from_set=False):
        self.raw = raw
        self.from_set = from_set


def go_print(v, what):
    """fmt %v of a value, as text/template prints it."""
    if v is None:
        raise RenderError(f"{what} is missing or null; Helm would print nothing here. Set it in values.yaml")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if isinstance(v, SetInt) else go_float(float(v))
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return v
    raise RenderError(f"{what} is a {type(v).__name__}; printing it would give Go's map[...] / [...] form, "
                      "not YAML. Print its fields one by one")


class SetInt(int):
    """An integer given with --set (Helm's strvals parses it as int64, printed as an integer)."""


def truth(v):
    """Go template truth."""
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict)):
        return len(v) > 0
    return True


def _line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def parse(text, name):
    """Parses a template into nodes: ('text', s) | ('print', expr, quote, line) | ('if', expr, then, else, line)."""
    tokens = []  # ('text', s) or ('action', body, line)
    pos = 0
    pending_trim_right = False
    for m in _ACTION.finditer(text):
        literal = text[pos : m.start()]
        if pending_trim_right:
            literal = literal.lstrip(_WS)
        if m.group(1):
            literal = literal.rstrip(_WS)
        tokens.append(("text", literal))
        body = m.group(2)
        line = _line_of(text, m.start())
        if "{{" in body:
            raise RenderError(f"{name}:{line}: an action is not closed before the next '{{{{'")
        tokens.append(("action", body.strip(_WS), line, m.group(0)))
        pending_trim_right = bool(m.group(3))
        pos = m.end()
    literal = text[pos:]
    if pending_trim_right:
        literal = literal.lstrip(_WS)
    if "{{" in literal or "}}" in literal:
        line = _line_of(text, pos + max(literal.find("{{"), literal.find("}}")))
        raise RenderError(f"{name}:{line}: '{{{{' or '}}}}' that is not a complete action (write {{{{ ... }}}}; "
                          "the trim markers are '{{- ' and ' -}}' with a space)")
    tokens.append(("text", literal))

    root = []
    stack = [(root, None)]  # (list being filled, the open 'if' node)
    for tok in tokens:
        if tok[0] == "text":
            if tok[1]:
                stack[-1][0].append(("text", tok[1]))
            continue
        _, body, line, raw = tok
        if body.startswith("/*") and body.endswith("*/"):
            continue
        if body.startswith("if ") or body.startswith("if\t"):
            expr = _expr(body[2:].strip(_WS), name, line, raw)
            node = ["if", expr, [], [], line]
            stack[-1][0].append(node)
            stack.append((node[2], node))
        elif body == "else":
            if stack[-1][1] is None or stack[-1][0] is stack[-1][1][3]:
                raise RenderError(f"{name}:{line}: {{{{ else }}}} without an open {{{{ if }}}}")
            node = stack.pop()[1]
            stack.append((node[3], node))
        elif body == "end":
            if stack[-1][1] is None:
                raise RenderError(f"{name}:{line}: {{{{ end }}}} without an open {{{{ if }}}}")
            stack.pop()
        else:
            quote = False
            parts = [p.strip(_WS) for p in body.split("|")]
            if len(parts) == 2 and parts[1] == "quote":
                quote = True
            elif len(parts) != 1:
                raise _unsupported(name, line, raw)
            stack[-1][0].append(("print", _expr(parts[0], name, line, raw), quote, line))
    if len(stack) > 1:
        raise RenderError(f"{name}:{stack[-1][1][4]}: {{{{ if }}}} is never closed with {{{{ end }}}}")
    return root


def _unsupported(name, line, raw):
    return RenderError(
        f"{name}:{line}: {raw} is outside the template subset tools/render-helm.py renders exactly as Helm "
        "({{ .Values.a.b }}, {{ .Release.Name }}, {{ .Release.Namespace }}, {{ X | quote }}, "
        "{{ if X }}/{{ else }}/{{ end }}, {{/* comment */}}); rewrite it with those, or extend the renderer")


def _expr(expr, name, line, raw):
    m = _FIELD_CHAIN.match(expr)
    if not m:
        raise _unsupported(name, line, raw)
    return m.group(1).split(".")


def lookup(ctx, path, for_if):
    """Resolves ['Values','a','b'] or ['Release','Name']. A missing last key is null (Go: a missing map key
    gives the zero value); a missing key before it is an error in Go templates (nil has no fields)."""
    cur = ctx
    for i, key in enumerate(path):
        if cur is None and i > 0:
            raise RenderError(f".{'.'.join(path[:i])} is missing or null, so .{'.'.join(path[: i + 1])} cannot be "
                              "read (Helm fails here too: nil pointer evaluating interface {}." + key + ")")
        if not isinstance(cur, dict):
            raise RenderError(f".{'.'.join(path[:i])} is a {type(cur).__name__}, not a map; "
                              f"it has no field {key}")
        cur = cur.get(key)
    return cur


def evaluate(nodes, ctx, name, out):
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "print":
            _, path, quote, line = node
            try:
                v = lookup(ctx, path, False)
                if quote:
                    # sprig quote skips nil arguments: {{ nil | quote }} prints nothing. Refused here.
                    text = go_print(v, "." + ".".join(path))
                    out.append(go_quote(text))
                else:
                    out.append(go_print(v, "." + ".".join(path)))
            except RenderError as e:
                raise RenderError(f"{name}:{line}: {e}") from None
        else:
            _, path, then, other, line = node
            try:
                cond = truth(lookup(ctx, path, True))
            except RenderError as e:
                raise RenderError(f"{name}:{line}: {e}") from None
            evaluate(then if cond else other, ctx, name, out)


def deep_merge(base, override):
    """Helm's value coalescing for user values: maps merge key by key, anything else replaces; null deletes."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_set(assignment, as_file=False):
    if "=" not in assignment:
        raise RenderError(f"--set {assignment}: write key.path=value")
    key, value = assignment.split("=", 1)
    if not re.fullmatch(rf"{_IDENT}(\.{_IDENT})*", key):
        raise RenderError(f"--set {assignment}: the key must be names separated by dots (no lists, no escapes)")
    if as_file:
        with open(value, encoding="utf-8") as f:
            parsed = f.read()
    elif any(c in value for c in ",[{\\"):
        raise RenderError(f"--set {assignment}: ',', '[', '{{' and '\\' have special meanings in Helm's --set "
                          "that this renderer does not implement; use --values FILE")
    elif value in ("true", "false"):
        parsed = value == "true"
    elif value == "null":
        parsed = None
    elif re.fullmatch(r"-?(0|[1-9][0-9]*)", value):
        parsed = SetInt(int(value))
    else:
        parsed = value
    tree = parsed
    for part in reversed(key.split(".")):
        tree = {part: tree}
    return tree


def load_chart(chart_dir):
    with open(os.path.join(chart_dir, "Chart.yaml"), encoding="utf-8") as f:
        chart = yaml.safe_load(f)
    if not isinstance(chart, dict):
        raise RenderError(f"{chart_dir}/Chart.yaml is not a map")
    for field in ("apiVersion", "name", "version"):
        if not chart.get(field):
            raise RenderError(f"{chart_dir}/Chart.yaml: {field} is required")
    if chart["apiVersion"] != "v2":
        raise RenderError(f"{chart_dir}/Chart.yaml: apiVersion is {chart['apiVersion']!r}; Helm 3 charts use v2")
    if not re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?", str(chart["version"])):
        raise RenderError(f"{chart_dir}/Chart.yaml: version {chart['version']!r} is not SemVer 2 (e.g. 0.1.0)")
    if chart.get("dependencies"):
        raise RenderError(f"{chart_dir}/Chart.yaml: dependencies are not supported by this renderer")
    values_path = os.path.join(chart_dir, "values.yaml")
    values = {}
    if os.path.exists(values_path):
        with open(values_path, encoding="utf-8") as f:
            values = yaml.safe_load(f) or {}
        if not isinstance(values, dict):
            raise RenderError(f"{values_path} is not a map")
    return chart, values


def render_chart(chart_dir, release_name="tessera", namespace="tessera-system", overrides=()):
    """Returns [(source name 'CHART/templates/FILE', rendered text)], in file-name order."""
    chart, values = load_chart(chart_dir)
    for o in overrides:
        values = deep_merge(values, o)
    ctx = {"Values": values, "Release": {"Name": release_name, "Namespace": namespace}}
    tdir = os.path.join(chart_dir, "templates")
    if not os.path.isdir(tdir):
        raise RenderError(f"{chart_dir} has no templates/ directory")
    out = []
    for root, dirs, files in os.walk(tdir):
        dirs.sort()
        for fname in sorted(files):
            rel = os.path.relpath(os.path.join(root, fname), chart_dir)
            if fname == "NOTES.txt":
                continue
            if fname.startswith("_"):
                raise RenderError(f"{rel}: partial templates (define/include) are not in this renderer's subset")
            if not fname.endswith((".yaml", ".yml")):
                raise RenderError(f"{rel}: Helm renders .yaml/.yml/.tpl/.txt templates; this renderer only "
                                  ".yaml and .yml")
            with open(os.path.join(root, fname), encoding="utf-8") as f:
                text = f.read()
            source = f"{chart['name']}/{rel}"
            pieces = []
            evaluate(parse(text, source), ctx, source, pieces)
            out.append((source, "".join(pieces)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="See the top of this file for the template subset.")
    ap.add_argument("chart", help="chart directory (holds Chart.yaml, values.yaml, templates/)")
    ap.add_argument("--name", default="tessera", help="release name (default tessera)")
    ap.add_argument("--namespace", default="tessera-system", help="release namespace (default tessera-system)")
    ap.add_argument("-f", "--values", action="append", default=[], help="a values file merged over values.yaml")
    ap.add_argument("--set", action="append", default=[], help="key.path=value (bool, null, int or string)")
    ap.add_argument("--set-file", action="append", default=[], help="key.path=FILE: the file's text")
    args = ap.parse_args()
    try:
        overrides = []
        for path in args.values:
            with open(path, encoding="utf-8") as f:
                v = yaml.safe_load(f) or {}
            if not isinstance(v, dict):
                raise RenderError(f"{path} is not a map of values")
            overrides.append(v)
        overrides += [parse_set(s) for s in args.set]
        overrides += [parse_set(s, as_file=True) for s in args.set_file]
        for source, text in render_chart(args.chart, args.name, args.namespace, overrides):
            if text.strip():
                sys.stdout.write(f"---\n# Source: {source}\n{text if text.endswith(chr(10)) else text + chr(10)}")
    except (RenderError, OSError, yaml.YAMLError) as e:
        print(f"render-helm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
