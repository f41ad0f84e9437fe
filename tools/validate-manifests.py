#!/usr/bin/python3
"""Validates Kubernetes manifests against the Kubernetes API schema, as the API server would read them.

Every YAML document under the given files and directories (default: deploy/) is checked; a directory holding a
Chart.yaml is a Helm chart and is rendered with its default values (tools/render-helm.py) and the rendered
documents are checked instead of its templates.

The schema is Debian's python3-kubernetes (22.6: the client generated from the OpenAPI schema of Kubernetes
1.22). Each document's apiVersion/kind names a model class (apps/v1 Deployment -> V1Deployment; the table is
read from the client's API modules: the class each create call returns); the document is then walked against the
models' openapi_types and attribute_map:
  - a field the model does not have is an error (with the nearest known name);
  - types must match: str, int (not bool), float, bool, dict(str, X), list[X], nested models; datetime as a
    string; IntOrString (openapi type "object": ports, maxSurge...) as a string or an integer; resource
    quantities as strings or numbers;
  - required fields and the patterns the client checks (caBundle is base64...) are checked by building the models
    with client-side validation on: their setters raise ValueError for a missing required field;
  - enumerations the OpenAPI schema of 1.22 leaves as free strings but the API server checks (imagePullPolicy,
    protocol, failurePolicy, sideEffects, ...) are checked from a table in this file;
  - Secret data and ConfigMap binaryData must be base64.
KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) has no model in the client: it is checked against a
schema written here from the documented v1 API (k8s.io/kube-scheduler/config/v1 types.go), with the checks of
kube-scheduler's own validation that concern the extenders (one bindVerb, weight > 0 with prioritizeVerb,
unique valid managedResources, durations). A ConfigMap whose data holds such a configuration (a key ending in
.yaml, .yml or .json whose text is a YAML map with apiVersion and kind) has it parsed and checked the same way.

Fields added after Kubernetes 1.22 are unknown to this schema and are reported as unknown fields.

  tools/validate-manifests.py                  # deploy/
  tools/validate-manifests.py FILE_OR_DIR...   # exit 0 when all is valid, 1 with one line per problem
  tools/validate-manifests.py --expect-invalid tests/testdata/manifests   # every file must be refused, for
                                               # each reason it states in a "# expect: TEXT" line
"""

import argparse
import base64
import binascii
import datetime
import difflib
import glob
import importlib.util
import os
import re
import sys

try:
    import yaml
    from kubernetes.client import models as k8s_models
    from kubernetes.client.configuration import Configuration
except ImportError as e:  # pragma: no cover - an environment problem, said plainly
    sys.exit(f"validate-manifests: {e}; install Debian's python3-kubernetes and python3-yaml "
             "(scripts/setup) and run this with /usr/bin/python3")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# ---------------------------------------------------------------------------------------------------------------
# apiVersion/kind -> model class, from the generated API modules.


def kind_table():
    """{(apiVersion, kind): (model class name, namespaced)}: read from the create calls of every API module."""
    api_dir = os.path.join(os.path.dirname(k8s_models.__file__), "..", "api")
    call = re.compile(r"call_api\(\s*'([^']+)', 'POST',(.*?)response_type='(\w+)'", re.S)
    path_re = re.compile(r"^/(?:api/(v1)|apis/([^/]+)/([^/]+))/(namespaces/\{namespace\}/)?([a-z0-9]+)$")
    cls_re = re.compile(r"^(?:[A-Z][a-z]+)*?V\d+(?:alpha\d+|beta\d+)?([A-Z]\w*)$")
    table = {}
    for path in sorted(glob.glob(os.path.join(api_dir, "*_api.py"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in call.finditer(text):
            if "call_api(" in m.group(2):
                continue  # the match ran into the next call: this one returns nothing
            p = path_re.match(m.group(1))
            if not p:
                continue
            api_version = p.group(1) or f"{p.group(2)}/{p.group(3)}"
            cm = cls_re.match(m.group(3))
            if not cm or not hasattr(k8s_models, m.group(3)):
                continue
            table[(api_version, cm.group(1))] = (m.group(3), p.group(4) is not None)
    return table


# Enumerations the API server checks but the 1.22 OpenAPI schema leaves as strings: (model, attribute) -> values.
ENUMS = {
    ("V1Container", "image_pull_policy"): {"Always", "IfNotPresent", "Never"},
    ("V1Container", "termination_message_policy"): {"File", "FallbackToLogsOnError"},
    ("V1PodSpec", "restart_policy"): {"Always", "OnFailure", "Never"},
    ("V1PodSpec", "dns_policy"): {"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"},
    ("V1PodSpec", "preemption_policy"): {"PreemptLowerPriority", "Never"},
    ("V1ContainerPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServicePort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServiceSpec", "type"): {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
    ("V1ServiceSpec", "session_affinity"): {"None", "ClientIP"},
    ("V1ServiceSpec", "external_traffic_policy"): {"Cluster", "Local"},
    ("V1HTTPGetAction", "scheme"): {"HTTP", "HTTPS"},
    ("V1DeploymentStrategy", "type"): {"RollingUpdate", "Recreate"},
    ("V1DaemonSetUpdateStrategy", "type"): {"RollingUpdate", "OnDelete"},
    ("V1LabelSelectorRequirement", "operator"): {"In", "NotIn", "Exists", "DoesNotExist"},
    ("V1NodeSelectorRequirement", "operator"): {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"},
    ("V1Toleration", "operator"): {"Exists", "Equal"},
    ("V1Toleration", "effect"): {"NoSchedule", "PreferNoSchedule", "NoExecute"},
    ("V1Taint", "effect"): {"NoSchedule", "PreferNoSchedule", "NoExecute"},
    ("V1HostPathVolumeSource", "type"): {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                                         "CharDevice", "BlockDevice"},
    ("V1VolumeMount", "mount_propagation"): {"None", "HostToContainer", "Bidirectional"},
    ("V1SeccompProfile", "type"): {"RuntimeDefault", "Unconfined", "Localhost"},
    ("V1MutatingWebhook", "failure_policy"): {"Ignore", "Fail"},
    ("V1ValidatingWebhook", "failure_policy"): {"Ignore", "Fail"},
    ("V1MutatingWebhook", "side_effects"): {"None", "NoneOnDryRun", "Some", "Unknown"},
    ("V1ValidatingWebhook", "side_effects"): {"None", "NoneOnDryRun", "Some", "Unknown"},
    ("V1MutatingWebhook", "match_policy"): {"Exact", "Equivalent"},
    ("V1ValidatingWebhook", "match_policy"): {"Exact", "Equivalent"},
    ("V1MutatingWebhook", "reinvocation_policy"): {"Never", "IfNeeded"},
    ("V1RuleWithOperations", "scope"): {"*", "Cluster", "Namespaced"},
    ("V1Subject", "kind"): {"User", "Group", "ServiceAccount"},
    ("V1RoleRef", "kind"): {"Role", "ClusterRole"},
}
ENUM_LISTS = {
    ("V1RuleWithOperations", "operations"): {"*", "CREATE", "UPDATE", "DELETE", "CONNECT"},
    ("V1MutatingWebhook", "admission_review_versions"): {"v1", "v1beta1"},
    ("V1ValidatingWebhook", "admission_review_versions"): {"v1", "v1beta1"},
    ("V1Capabilities", "drop"): None,  # any capability name
}
# Resource quantities: the schema says string; the API server also accepts a JSON number.
QUANTITY_MAPS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
                 ("V1ResourceQuotaSpec", "hard"), ("V1LimitRangeItem", "default"),
                 ("V1LimitRangeItem", "default_request"), ("V1LimitRangeItem", "max"), ("V1LimitRangeItem", "min"),
                 ("V1Overhead", "pod_fixed")}
QUANTITIES = {("V1EmptyDirVolumeSource", "size_limit")}
# openapi "object" fields that are IntOrString; other "object" fields hold arbitrary JSON.
INT_OR_STRING = {"port", "target_port", "max_surge", "max_unavailable", "min_available"}
BASE64_MAPS = {("V1Secret", "data"), ("V1ConfigMap", "binary_data")}


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, path, message):
        self.items.append(f"{where}: {path or '(document)'}: {message}")


def type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean {str(v).lower()}"
    if isinstance(v, (int, float)):
        return f"number {v}"
    if isinstance(v, str):
        return f"string {v!r}"
    if isinstance(v, dict):
        return "a map"
    if isinstance(v, list):
        return "a list"
    return type(v).__name__


def join(path, key):
    return f"{path}.{key}" if path else key


class Validator:
    def __init__(self):
        self.kinds = kind_table()
        self.strict = Configuration()
        self.strict.client_side_validation = True
        self.lax = Configuration()
        self.lax.client_side_validation = False

    # -- generic walk -------------------------------------------------------------------------------------------
    def check(self, value, typ, path, where, problems, owner=None):
        """Checks value against an openapi type string; returns the value to give the model's setter."""
        if value is None:
            return None
        m = re.fullmatch(r"list\[(.+)\]", typ)
        if m:
            if not isinstance(value, list):
                problems.add(where, path, f"expected a list, got {type_name(value)}")
                return None
            return [self.check(v, m.group(1), f"{path}[{i}]", where, problems, owner) for i, v in enumerate(value)]
        m = re.fullmatch(r"dict\(str, (.+)\)", typ)
        if m:
            if not isinstance(value, dict):
                problems.add(where, path, f"expected a map, got {type_name(value)}")
                return None
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    problems.add(where, path, f"map key {k!r} is a {type_name(k)}; keys are strings: quote it")
                    continue
                sub = f'{path}["{k}"]' if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", k) else join(path, k)
                if owner in QUANTITY_MAPS and isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = str(v)
                    continue
                out[k] = self.check(v, m.group(1), sub, where, problems, owner)
            return out
        if typ == "str":
            if isinstance(value, (datetime.date, datetime.datetime)):
                return str(value)  # YAML timestamps: the API server reads them as strings
            if owner in QUANTITIES and isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            if not isinstance(value, str):
                hint = " (YAML reads yes/no/on/off/true/false as booleans: quote it)" if isinstance(value, bool) \
                    else " (quote it)" if isinstance(value, (int, float)) else ""
                problems.add(where, path, f"expected a string, got {type_name(value)}{hint}")
            return value
        if typ == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                problems.add(where, path, f"expected an integer, got {type_name(value)}")
            return value
        if typ == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.add(where, path, f"expected a number, got {type_name(value)}")
            return value
        if typ == "bool":
            if not isinstance(value, bool):
                problems.add(where, path, f"expected true or false, got {type_name(value)}")
            return value
        if typ in ("datetime", "date"):
            if not isinstance(value, (str, datetime.date, datetime.datetime)):
                problems.add(where, path, f"expected a time as a string, got {type_name(value)}")
            return value
        if typ == "object":
            attr = owner[1] if isinstance(owner, tuple) else None
            if attr in INT_OR_STRING and (isinstance(value, bool) or not isinstance(value, (str, int))):
                problems.add(where, path, f"expected an integer or a string, got {type_name(value)}")
            return value
        klass = getattr(k8s_models, typ, None)
        if klass is None:
            problems.add(where, path, f"the schema names an unknown type {typ}")
            return value
        return self.check_model(value, klass, path, where, problems)

    def check_model(self, value, klass, path, where, problems):
        if not isinstance(value, dict):
            problems.add(where, path, f"expected a map ({klass.__name__}), got {type_name(value)}")
            return None
        by_json = {j: a for a, j in klass.attribute_map.items()}
        kwargs = {}
        for key, v in value.items():
            if key not in by_json:
                close = difflib.get_close_matches(str(key), list(by_json), n=1)
                hint = f'; did you mean "{close[0]}"?' if close else f"; {klass.__name__} has: {', '.join(sorted(by_json))}"
                problems.add(where, join(path, key), f'unknown field "{key}"{hint}')
                continue
            attr = by_json[key]
            owner = (klass.__name__, attr)
            sub = join(path, key)
            kwargs[attr] = self.check(v, klass.openapi_types[attr], sub, where, problems, owner)
            if kwargs[attr] is None:
                continue
            allowed = ENUMS.get(owner)
            if allowed is not None and isinstance(v, str) and v not in allowed:
                problems.add(where, sub, f"{v!r} is not one of {', '.join(sorted(allowed))}")
            allowed = ENUM_LISTS.get(owner)
            if allowed and isinstance(v, list):
                for i, item in enumerate(v):
                    if isinstance(item, str) and item not in allowed:
                        problems.add(where, f"{sub}[{i}]", f"{item!r} is not one of {', '.join(sorted(allowed))}")
            if owner in BASE64_MAPS and isinstance(v, dict):
                for k, data in v.items():
                    try:
                        base64.b64decode(str(data), validate=True)
                    except (binascii.Error, ValueError):
                        problems.add(where, f'{sub}["{k}"]', "is not base64 (use stringData for plain text)")
        # Required fields and patterns: the model's setters, with client-side validation on.
        obj = klass(local_vars_configuration=self.lax)
        obj.local_vars_configuration = self.strict
        for attr in klass.openapi_types:
            try:
                setattr(obj, attr, kwargs.get(attr))
            except ValueError as e:
                msg = str(e)
                field = klass.attribute_map[attr]
                if "must not be `None`" in msg:
                    problems.add(where, join(path, field), f"required field missing ({klass.__name__})")
                else:
                    problems.add(where, join(path, field), msg.replace(f"`{attr}`", f"`{field}`"))
        return obj

    # -- documents ----------------------------------------------------------------------------------------------
    def check_document(self, doc, where, problems, path=""):
        if not isinstance(doc, dict):
            problems.add(where, path, f"a manifest is a map with apiVersion and kind, got {type_name(doc)}")
            return
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            problems.add(where, path, "apiVersion and kind are required strings")
            return
        if api_version.startswith("kubescheduler.config.k8s.io/"):
            check_scheduler_config(doc, where, problems, path)
            return
        entry = self.kinds.get((api_version, kind))
        if entry is None:
            known = sorted({k for (_, k) in self.kinds})
            close = difflib.get_close_matches(kind, known, n=1)
            versions = sorted(v for (v, k) in self.kinds if k == kind)
            hint = (f"; {kind} is served as {', '.join(versions)}" if versions else
                    f'; did you mean kind "{close[0]}"?' if close else "")
            problems.add(where, join(path, "kind"),
                         f"no schema for {api_version} {kind} (Kubernetes 1.22 built-in kinds and "
                         f"KubeSchedulerConfiguration are known){hint}")
            return
        klass = getattr(k8s_models, entry[0])
        self.check_model(doc, klass, path, where, problems)
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            problems.add(where, join(path, "metadata.name"), "every object needs a name")
        elif entry[1] is False and isinstance(meta, dict) and meta.get("namespace"):
            problems.add(where, join(path, "metadata.namespace"), f"{kind} is cluster-scoped: remove the namespace")
        if kind == "ConfigMap" and isinstance(doc.get("data"), dict):
            for key, text in doc["data"].items():
                if not isinstance(text, str) or not str(key).endswith((".yaml", ".yml", ".json")):
                    continue
                sub = join(path, f'data["{key}"]')
                try:
                    embedded = yaml.safe_load(text)
                except yaml.YAMLError as e:
                    problems.add(where, sub, f"does not parse as YAML: {str(e).splitlines()[0]}")
                    continue
                if isinstance(embedded, dict) and "apiVersion" in embedded and "kind" in embedded:
                    self.check_document(embedded, where, problems, sub + " (embedded)")


# ---------------------------------------------------------------------------------------------------------------
# KubeSchedulerConfiguration, kubescheduler.config.k8s.io/v1, written from k8s.io/kube-scheduler/config/v1.
# Field types: "str", "int", "float", "bool", "duration" (Go duration string), "base64", "any", a dict (a
# struct: field -> type) or a one-element list (a list of that type).

_PLUGIN = {"name": "str", "weight": "int"}
_PLUGIN_SET = {"enabled": [_PLUGIN], "disabled": [_PLUGIN]}
_PLUGINS = {k: _PLUGIN_SET for k in ("preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore",
                                     "score", "reserve", "permit", "preBind", "bind", "postBind", "multiPoint")}
_EXTENDER = {
    "urlPrefix": "str", "filterVerb": "str", "preemptVerb": "str", "prioritizeVerb": "str", "weight": "int",
    "bindVerb": "str", "enableHTTPS": "bool",
    "tlsConfig": {"insecure": "bool", "serverName": "str", "certFile": "str", "keyFile": "str", "caFile": "str",
                  "certData": "base64", "keyData": "base64", "caData": "base64"},
    "httpTimeout": "duration", "nodeCacheCapable": "bool",
    "managedResources": [{"name": "str", "ignoredByScheduler": "bool"}], "ignorable": "bool",
}
KUBE_SCHEDULER_CONFIGURATION_V1 = {
    "apiVersion": "str", "kind": "str",
    "parallelism": "int",
    "leaderElection": {"leaderElect": "bool", "leaseDuration": "duration", "renewDeadline": "duration",
                       "retryPeriod": "duration", "resourceLock": "str", "resourceName": "str",
                       "resourceNamespace": "str"},
    "clientConnection": {"kubeconfig": "str", "acceptContentTypes": "str", "contentType": "str", "qps": "float",
                         "burst": "int"},
    "enableProfiling": "bool", "enableContentionProfiling": "bool",
    "percentageOfNodesToScore": "int", "podInitialBackoffSeconds": "int", "podMaxBackoffSeconds": "int",
    "profiles": [{"schedulerName": "str", "percentageOfNodesToScore": "int", "plugins": _PLUGINS,
                  "pluginConfig": [{"name": "str", "args": "any"}]}],
    "extenders": [_EXTENDER],
    "delayCacheUntilActive": "bool",
}
_DURATION = re.compile(r"^-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|ms|s|m|h)(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:ns|us|µs|ms|s|m|h))*$|^0$")
_EXTENDED_RESOURCE = re.compile(r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
                                r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def check_schema(value, schema, path, where, problems):
    if value is None:
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            problems.add(where, path, f"expected a list, got {type_name(value)}")
            return
        for i, v in enumerate(value):
            check_schema(v, schema[0], f"{path}[{i}]", where, problems)
        return
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            problems.add(where, path, f"expected a map, got {type_name(value)}")
            return
        for k, v in value.items():
            if k not in schema:
                close = difflib.get_close_matches(str(k), list(schema), n=1)
                hint = f'; did you mean "{close[0]}"?' if close else f"; known: {', '.join(sorted(schema))}"
                problems.add(where, join(path, k), f'unknown field "{k}"{hint}')
            else:
                check_schema(v, schema[k], join(path, k), where, problems)
        return
    ok = {"str": lambda v: isinstance(v, str),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "bool": lambda v: isinstance(v, bool),
          "duration": lambda v: isinstance(v, str) and _DURATION.match(v) is not None,
          "base64": lambda v: isinstance(v, str) and _is_base64(v),
          "any": lambda v: True}[schema]
    if not ok(value):
        what = {"duration": 'a duration such as "10s" or "1m30s"', "base64": "base64 data", "str": "a string",
                "int": "an integer", "float": "a number", "bool": "true or false"}[schema]
        problems.add(where, path, f"expected {what}, got {type_name(value)}")


def _is_base64(s):
    try:
        base64.b64decode(s, validate=True)
        return True
    except (binascii.Error, ValueError):
        return False


def check_scheduler_config(doc, where, problems, path=""):
    if doc.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or doc.get("kind") != "KubeSchedulerConfiguration":
        problems.add(where, join(path, "apiVersion"),
                     f"{doc.get('apiVersion')} {doc.get('kind')}: only kubescheduler.config.k8s.io/v1 "
                     "KubeSchedulerConfiguration (Kubernetes 1.25+) is known")
        return
    check_schema(doc, KUBE_SCHEDULER_CONFIGURATION_V1, path, where, problems)
    # kube-scheduler's own validation (pkg/scheduler/apis/config/validation), the parts about these fields.
    profiles = doc.get("profiles") or []
    names = [p.get("schedulerName") for p in profiles if isinstance(p, dict)]
    for i, n in enumerate(names):
        if not n:
            problems.add(where, join(path, f"profiles[{i}].schedulerName"), "required: the name pods ask for")
        elif names.index(n) != i:
            problems.add(where, join(path, f"profiles[{i}].schedulerName"), f"duplicate profile name {n!r}")
    extenders = doc.get("extenders") or []
    binders = 0
    seen = {}
    for i, e in enumerate(extenders if isinstance(extenders, list) else []):
        if not isinstance(e, dict):
            continue
        ep = join(path, f"extenders[{i}]")
        url = e.get("urlPrefix")
        if not isinstance(url, str) or not re.match(r"^https?://[^/]+", url or ""):
            problems.add(where, join(ep, "urlPrefix"), "required: the extender's base URL, http(s)://HOST:PORT/PATH")
        elif url.startswith("https://") != bool(e.get("enableHTTPS")):
            problems.add(where, join(ep, "enableHTTPS"),
                         f"urlPrefix is {url.split(':')[0]} but enableHTTPS is {bool(e.get('enableHTTPS'))}: "
                         "kube-scheduler picks the scheme from enableHTTPS")
        if e.get("prioritizeVerb") and not (isinstance(e.get("weight"), int) and e.get("weight") > 0):
            problems.add(where, join(ep, "weight"), "must be a positive integer when prioritizeVerb is set")
        if e.get("bindVerb"):
            binders += 1
        for j, r in enumerate(e.get("managedResources") or []):
            if not isinstance(r, dict):
                continue
            name = r.get("name")
            rp = join(ep, f"managedResources[{j}].name")
            if not isinstance(name, str) or not _EXTENDED_RESOURCE.match(name) or \
                    name.split("/")[0].endswith("kubernetes.io") or name.startswith("requests."):
                problems.add(where, rp, f"{name!r} is not a valid extended resource name (DOMAIN/NAME, not in "
                                        "kubernetes.io)")
            elif name in seen:
                problems.add(where, rp, f"{name} is already managed by {seen[name]}")
            else:
                seen[name] = ep
    if binders > 1:
        problems.add(where, join(path, "extenders"), "only one extender can implement bind")


# ---------------------------------------------------------------------------------------------------------------

def load_renderer():
    spec = importlib.util.spec_from_file_location("render_helm", os.path.join(HERE, "render-helm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documents_of(path, problems):
    """[(where, doc)] of one file or directory; charts are rendered."""
    out = []
    rel = os.path.relpath(path, os.getcwd())
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "Chart.yaml")):
            renderer = load_renderer()
            try:
                rendered = renderer.render_chart(path)
            except (renderer.RenderError, yaml.YAMLError, OSError) as e:
                problems.add(rel, "", f"the chart does not render: {e}")
                return out
            for source, text in rendered:
                out += parse_yaml(text, f"{rel} (rendered {source})", problems)
            return out
        for entry in sorted(os.listdir(path)):
            full = os.path.join(path, entry)
            if os.path.isdir(full) or entry.endswith((".yaml", ".yml")):
                out += documents_of(full, problems)
        return out
    with open(path, encoding="utf-8") as f:
        return parse_yaml(f.read(), rel, problems)


def parse_yaml(text, where, problems):
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        problems.add(where, "", f"not valid YAML: {' '.join(str(e).split())}")
        return []
    out = []
    for i, d in enumerate(docs):
        if d is None:
            continue  # an empty document (a trailing ---, or an if that rendered nothing)
        kind = d.get("kind", "?") if isinstance(d, dict) else "?"
        name = (d.get("metadata") or {}).get("name", "?") if isinstance(d, dict) and \
            isinstance(d.get("metadata"), dict) else "?"
        out.append((f"{where} (document {i + 1}, {kind} {name})", d))
    return out


def validate(paths):
    problems = Problems()
    validator = Validator()
    count = 0
    for p in paths:
        if not os.path.exists(p):
            problems.add(p, "", "no such file or directory")
            continue
        for where, doc in documents_of(p, problems):
            count += 1
            validator.check_document(doc, where, problems)
    return count, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="See the top of this file for what is checked.")
    ap.add_argument("paths", nargs="*", help="files and directories (default: deploy/ of the repository)")
    ap.add_argument("--expect-invalid", action="store_true",
                    help="test mode: every file given (or found in the directories) must be refused")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    args = ap.parse_args()
    paths = args.paths or [os.path.join(REPO, "deploy")]
    if args.expect_invalid:
        files = []  # files, and charts (directories with a Chart.yaml) as one unit each
        for p in paths:
            if not os.path.isdir(p):
                files.append(p)
                continue
            for root, dirs, names in os.walk(p):
                dirs.sort()
                if "Chart.yaml" in names:
                    files.append(root)
                    dirs.clear()
                    continue
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith((".yaml", ".yml"))]
        if not files:
            print("validate-manifests: --expect-invalid found no files", file=sys.stderr)
            return 1
        failed = 0
        for f in files:
            count, problems = validate([f])
            expected = []
            for src in glob.glob(os.path.join(f, "**", "*"), recursive=True) if os.path.isdir(f) else [f]:
                if os.path.isfile(src):
                    with open(src, encoding="utf-8") as fh:
                        expected += [m.group(1).strip() for m in re.finditer(r"^# expect: (.+)$", fh.read(), re.M)]
            missing = [e for e in expected if not any(e in item for item in problems.items)]
            if not problems.items:
                print(f"validate-manifests: {f}: expected to be refused, but it is valid ({count} documents)")
                failed += 1
            elif missing:
                print(f"validate-manifests: {f}: refused, but not for what it expects:")
                for e in missing:
                    print(f"  expected a problem containing: {e}")
                for item in problems.items:
                    print(f"  got: {item}")
                failed += 1
            elif not args.quiet:
                print(f"refused as expected: {f}")
                for item in problems.items:
                    print(f"  {item}")
        return 1 if failed else 0
    count, problems = validate(paths)
    for item in problems.items:
        print(item)
    if problems.items:
        print(f"validate-manifests: {len(problems.items)} problems in {count} documents", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"validate-manifests: {count} documents valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
