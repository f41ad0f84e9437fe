#!/usr/bin/python3
"""Tests of tools/render-helm.py: the template subset renders as Helm renders it, and the rest is refused."""

import importlib.util
import os
import sys
import tempfile
import unittest

import yaml

SOURCE = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
spec = importlib.util.spec_from_file_location("render_helm", os.path.join(SOURCE, "tools", "render-helm.py"))
rh = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rh)


def render(text, values, release=None):
    out = []
    ctx = {"Values": values, "Release": release or {"Name": "tessera", "Namespace": "tessera-system"}}
    rh.evaluate(rh.parse(text, "t.yaml"), ctx, "t.yaml", out)
    return "".join(out)


class RenderHelmTest(unittest.TestCase):
    def test_values_release_and_quote(self):
        self.assertEqual(render("a: {{ .Values.x.y }} {{ .Release.Name }} {{ .Release.Namespace | quote }}",
                                {"x": {"y": "v"}}), 'a: v tessera "tessera-system"')

    def test_numbers_print_as_helm_prints_float64(self):
        # Helm reads values.yaml through JSON: every number is a float64, printed with Go's %v.
        cases = {2: "2", 100000: "100000", 1000000: "1e+06", 1234567: "1.234567e+06", 0.5: "0.5",
                 0.0001: "0.0001", 0.00001: "1e-05", 2.0: "2", -3: "-3"}
        for value, text in cases.items():
            self.assertEqual(render("{{ .Values.n }}", {"n": value}), text, value)
        # --set integers are int64.
        self.assertEqual(render("{{ .Values.n }}", rh.parse_set("n=1000000")), "1000000")

    def test_quote_escapes_as_go(self):
        self.assertEqual(render("{{ .Values.s | quote }}", {"s": 'a"b\\c\n\x01é'}), '"a\\"b\\\\c\\n\\x01é"')
        self.assertEqual(render("{{ .Values.b | quote }}", {"b": True}), '"true"')

    def test_if_else_and_trim_markers(self):
        text = "a: 1\n{{- if .Values.f }}\nb: 2\n{{- else }}\nc: 3\n{{- end }}\nd: 4\n"
        self.assertEqual(render(text, {"f": True}), "a: 1\nb: 2\nd: 4\n")
        self.assertEqual(render(text, {"f": False}), "a: 1\nc: 3\nd: 4\n")
        for falsy in (0, "", [], {}, None):
            self.assertEqual(render("{{ if .Values.f }}x{{ end }}", {"f": falsy}), "")
        self.assertEqual(render("{{ if .Values.missing }}x{{ end }}", {}), "")
        self.assertEqual(render("a  {{- /* note */ -}}  b", {}), "ab")

    def test_refused(self):
        for text, values in [('{{ include "x" . }}', {}), ("{{ .Values.a | upper }}", {"a": "x"}),
                             ("{{ if .Values.a }}", {"a": 1}), ("{{ end }}", {}), ("{{ .Values.gone }}", {}),
                             ("{{ .Values.a.b.c }}", {"a": {}}), ("{{ .Values.m }}", {"m": {"k": 1}}),
                             ("{{ .Values.l }}", {"l": [1]}), ("{{-3}}", {}), ("a {{ b", {})]:
            with self.assertRaises(rh.RenderError, msg=text):
                render(text, values)

    def test_set_parsing(self):
        self.assertEqual(rh.parse_set("a.b=true"), {"a": {"b": True}})
        self.assertEqual(rh.parse_set("a=text"), {"a": "text"})
        self.assertIsNone(rh.parse_set("a=null")["a"])
        with self.assertRaises(rh.RenderError):
            rh.parse_set("a=x,b=y")

    def test_the_chart_renders_with_its_defaults(self):
        chart = os.path.join(SOURCE, "deploy", "helm", "tessera")
        rendered = dict(rh.render_chart(chart))
        self.assertIn("tessera/templates/tessera-scheduler.yaml", rendered)
        self.assertNotIn("{{", "".join(rendered.values()))
        # webhook.enabled false drops the webhooks.
        off = dict(rh.render_chart(chart, overrides=[{"webhook": {"enabled": False}}]))
        self.assertEqual([d for d in yaml.safe_load_all(off["tessera/templates/webhooks.yaml"]) if d], [])
        self.assertEqual(len([d for d in yaml.safe_load_all(rendered["tessera/templates/webhooks.yaml"]) if d]), 2)

    def test_chart_yaml_checked(self):
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "templates"))
            with open(os.path.join(d, "Chart.yaml"), "w") as f:
                f.write("apiVersion: v1\nname: x\nversion: 0.1.0\n")
            with self.assertRaises(rh.RenderError):
                rh.render_chart(d)


if __name__ == "__main__":
    unittest.main()
