"""deploy/chart renders, for each choice, the objects deploy/'s kustomize overlays build.

Each choice is rendered twice: ``helm template`` of the chart with the values that make
it, and ``kubectl kustomize`` (our kubectl, tests.gotools) of an overlay that makes it
from deploy/, in a copy with ``subres certs`` output in ``deploy/certs`` as the install
docs write it. The two must hold the same objects, field for field, after normalising
only what legitimately differs between the tools:

- the chart's standard labels (``helm.sh/chart``, ``app.kubernetes.io/managed-by``,
  ``…/instance``, ``…/version``) on every object's own metadata, which the test checks
  are there and then drops;
- the CRD's ``helm.sh/resource-policy: keep`` (``helm uninstall`` leaves the Machines);
- the recordings ConfigMap: kustomize's generator suffixes its name with a hash of the
  contents (so a change rolls the replicas), the chart names it plainly and puts a
  checksum annotation on the pod template instead; its ``config.yaml`` is compared as
  the YAML it parses to (the kustomize copy keeps the file's comments).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from subres import config as configfile
from subres.main import main

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "chart"
RELEASE = "subres"
APISERVICE = "v1alpha1.subresources.subres.dev"

HELM_LABELS = {
    "helm.sh/chart": "subres-0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": "0.1.0",
}
"""Labels the chart adds to every object (templates/_helpers.tpl), with their values here."""
CHECKSUM = "checksum/recordings-config"
GENERATED = re.compile(r"^(subres-recordings-config)-[a-z0-9]{10}$")
"""A name kustomize's configMapGenerator made: the given name and a hash of the contents."""

Key = tuple[str, str, str, str]
Objects = dict[Key, dict[str, Any]]


@dataclass(frozen=True)
class Choice:
    """One way to install: an overlay of deploy/ and the chart values that mean the same."""

    name: str
    overlay: str
    """deploy/site/kustomization.yaml (beside it: apiservice-cabundle.yaml from certs)."""
    values: tuple[str, ...]
    """`helm template` arguments; {certs} is the `subres certs` directory."""


def sets(*pairs: str) -> tuple[str, ...]:
    """`--set` arguments, one per KEY=VALUE."""
    return tuple(arg for pair in pairs for arg in ("--set", pair))


SELF_SIGNED = ("-f", "{certs}/values.yaml")
EXISTING = (
    *sets("certificates.source=existingSecrets"),
    *("--set-file", "certificates.existingSecrets.caBundle={certs}/ca.crt"),
)
DIGEST = "sha256:" + "a" * 64
CHOICES = [
    Choice("self-signed", "resources: [../self-signed]\n", SELF_SIGNED),
    Choice(
        "cert-manager", "resources: [../cert-manager]\n", sets("certificates.source=certManager")
    ),
    # Your own Secrets, made outside the install; the APIService gets your CA.
    Choice(
        "existing-secrets",
        "resources: [../base]\npatches: [{path: apiservice-cabundle.yaml}]\n",
        EXISTING,
    ),
    Choice(
        "image-and-replicas",
        "resources: [../self-signed]\n"
        "images: [{name: subres, newName: registry.example.com/subres, newTag: 0.2.0}]\n"
        "replicas: [{name: subres, count: 3}]\n",
        (
            *SELF_SIGNED,
            *sets("image.repository=registry.example.com/subres", "image.tag=0.2.0", "replicas=3"),
        ),
    ),
    Choice(
        "image-digest",
        "resources: [../self-signed]\n"
        f"images: [{{name: subres, newName: registry.example.com/subres, digest: '{DIGEST}'}}]\n",
        (
            *SELF_SIGNED,
            *sets("image.repository=registry.example.com/subres", f"image.digest={DIGEST}"),
        ),
    ),
    Choice(
        "monitoring",
        "resources: [../self-signed]\ncomponents: [../components/monitoring]\n",
        (*SELF_SIGNED, *sets("monitoring.enabled=true")),
    ),
    Choice(
        "recordings",
        "resources: [../self-signed]\ncomponents: [../components/recordings]\n",
        (*SELF_SIGNED, *sets("recordings.enabled=true")),
    ),
    Choice(
        "cert-manager-monitoring-recordings",
        "resources: [../cert-manager]\n"
        "components: [../components/monitoring, ../components/recordings]\n",
        sets(
            "certificates.source=certManager", "monitoring.enabled=true", "recordings.enabled=true"
        ),
    ),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/ with `subres certs` output in deploy/certs, as the docs make it."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("certs", "site", "chart"))
    assert main(["certs", "--out", str(root / "certs")]) == 0
    return root


def run(args: list[str], *, home: Path) -> subprocess.CompletedProcess[str]:
    """A tool with a scratch HOME (Helm keeps its caches and config there), no kubeconfig."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(home / "absent")}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)


def helm(helm_bin: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(helm_bin), *args], home=home)


def kustomize(kubectl_bin: Path, site: Path, choice: Choice) -> Objects:
    overlay = site / "site"
    shutil.rmtree(overlay, ignore_errors=True)
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(choice.overlay)
    shutil.copy(site / "certs" / "apiservice-cabundle.yaml", overlay)
    built = run([str(kubectl_bin), "kustomize", str(overlay)], home=site.parent)
    assert built.returncode == 0, built.stderr
    return _objects(built.stdout)


def template(helm_bin: Path, site: Path, choice: Choice) -> Objects:
    values = [v.format(certs=site / "certs") for v in choice.values]
    rendered = helm(helm_bin, site.parent, "template", RELEASE, str(CHART), *values)
    assert rendered.returncode == 0, rendered.stderr
    return _objects(rendered.stdout)


def keyed(docs: Iterable[dict[str, Any]]) -> Objects:
    """Objects by what names them: API version, kind, namespace, name."""
    objects = {}
    for doc in docs:
        meta = doc["metadata"]
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in objects, key
        objects[key] = doc
    return objects


def _objects(text: str) -> Objects:
    return keyed(doc for doc in yaml.safe_load_all(text) if doc)


def _templated(doc: dict[str, Any]) -> dict[str, Any]:
    """The chart's object without what only Helm adds (checked here, then dropped)."""
    meta = doc["metadata"]
    labels = meta.pop("labels")
    assert {k: labels.pop(k, None) for k in HELM_LABELS} == HELM_LABELS, meta["name"]
    if labels:
        meta["labels"] = labels
    if doc["kind"] == "CustomResourceDefinition":
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}
    if doc["kind"] == "Deployment":
        template = doc["spec"]["template"]["metadata"]
        if "annotations" in template:
            assert set(template.pop("annotations")) == {CHECKSUM}
    return _parsed_config(doc)


def _kustomized(doc: dict[str, Any]) -> dict[str, Any]:
    """The overlay's object with the generated ConfigMap's name as the chart names it."""
    if doc["kind"] == "ConfigMap":
        doc["metadata"]["name"] = GENERATED.sub(r"\1", doc["metadata"]["name"])
    if doc["kind"] == "Deployment":
        for volume in doc["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in volume:
                volume["configMap"]["name"] = GENERATED.sub(r"\1", volume["configMap"]["name"])
    return _parsed_config(doc)


def _parsed_config(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
        doc["data"]["config.yaml"] = yaml.safe_load(doc["data"]["config.yaml"])
    return doc


@pytest.mark.parametrize("choice", CHOICES, ids=[c.name for c in CHOICES])
def test_the_chart_renders_what_kustomize_builds(
    choice: Choice, site: Path, helm_bin: Path, kubectl_bin: Path
) -> None:
    wanted = keyed(_kustomized(d) for d in kustomize(kubectl_bin, site, choice).values())
    rendered = keyed(_templated(d) for d in template(helm_bin, site, choice).values())
    assert sorted(rendered) == sorted(wanted)
    for key, doc in wanted.items():
        assert rendered[key] == doc, key


def test_a_new_recordings_configuration_rolls_the_replicas(site: Path, helm_bin: Path) -> None:
    def render(*values: str) -> tuple[str, dict[str, Any]]:
        """The pod template's checksum and the configuration the ConfigMap holds."""
        args = [*SELF_SIGNED, "--set", "recordings.enabled=true", *values]
        objects = template(helm_bin, site, Choice("recordings", "", tuple(args))).values()
        [deployment] = [d for d in objects if d["kind"] == "Deployment"]
        [configmap] = [d for d in objects if d["kind"] == "ConfigMap"]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations[CHECKSUM], yaml.safe_load(configmap["data"]["config.yaml"])

    first, _ = render()
    second, config = render("--set", "recordings.maxAge=604800")
    assert first != second
    # What the chart writes is a configuration subres reads, with every value in it.
    assert config["consoles"]["recordings"]["maxAge"] == 604800
    parsed = configfile.parse(config)
    assert parsed.consoles.recordings == "/var/lib/subres/recordings"


@pytest.mark.parametrize(
    "values",
    [
        SELF_SIGNED,
        sets("certificates.source=certManager"),
        (*EXISTING, *sets("monitoring.enabled=true", "recordings.enabled=true")),
    ],
    ids=["self-signed", "cert-manager", "existing-secrets-monitoring-recordings"],
)
def test_helm_lint_passes(values: tuple[str, ...], site: Path, helm_bin: Path) -> None:
    args = [v.format(certs=site / "certs") for v in values]
    linted = helm(helm_bin, site.parent, "lint", "--strict", str(CHART), *args)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


def test_without_certificates_the_chart_says_where_to_get_them(site: Path, helm_bin: Path) -> None:
    rendered = helm(helm_bin, site.parent, "template", RELEASE, str(CHART))
    assert rendered.returncode != 0
    assert re.search(r"certificates\.selfSigned\.\S+ is empty", rendered.stderr)
    assert "subres certs --out deploy/certs" in rendered.stderr


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("certificates.source=vault", "certificates/source"),
        ("replicas=0", "replicas"),
        ("recordings.objectStore=s3", "objectStore"),
    ],
)
def test_the_schema_refuses_what_the_chart_does_not_do(
    value: str, complaint: str, site: Path, helm_bin: Path
) -> None:
    args = [v.format(certs=site / "certs") for v in SELF_SIGNED]
    rendered = helm(helm_bin, site.parent, "template", RELEASE, str(CHART), *args, "--set", value)
    assert rendered.returncode != 0
    assert "values don't meet the specifications of the schema" in rendered.stderr
    assert complaint in rendered.stderr


def docs_block(section: str, word: str) -> str:
    """The one ``sh`` block of docs/operating.md's `section` that holds `word`."""
    text = (REPO / "docs" / "operating.md").read_text()
    found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, section
    [block] = [b for b in re.findall(r"^```sh\n(.*?)^```", found[1], re.M | re.S) if word in b]
    return str(block)


def test_the_docs_helm_install_installs_what_the_docs_kustomize_install_applies(
    tmp_path: Path, helm_bin: Path, kubectl_bin: Path
) -> None:
    """Both install blocks of docs/operating.md, run word for word with no cluster to talk to:
    ``helm install`` with ``--dry-run=client`` added, ``kubectl apply -k`` as ``kubectl
    kustomize``, ``kubectl wait`` not at all. Each in a copy of deploy/ of its own (each
    makes its own certificates), compared as the choices above are."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "subres").symlink_to(Path(sys.executable).parent / "subres")
    # What the blocks' commands print is the manifest each would send to the cluster.
    (tools / "helm").write_text(f'#!/bin/sh\nexec {helm_bin} "$@" --dry-run=client\n')
    (tools / "kubectl").write_text(
        f'#!/bin/sh\n[ "$1" = apply ] && [ "$2" = -k ] && exec {kubectl_bin} kustomize "$3"\n'
        '[ "$1" = wait ]\n'
    )
    for tool in ("helm", "kubectl"):
        (tools / tool).chmod(0o755)

    def run_block(block: str, name: str) -> str:
        work = tmp_path / name
        shutil.copytree(DEPLOY, work / "deploy", ignore=shutil.ignore_patterns("certs", "site"))
        env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(work), "KUBECONFIG": "/absent"}
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{block}\n{done.stdout}{done.stderr}"
        return done.stdout

    helm_block = docs_block("Install with Helm", "helm install")
    assert "helm install subres deploy/chart -f deploy/certs/values.yaml" in helm_block
    released = run_block(helm_block, "helm")
    # `helm install` prints the release's notes, then the manifest after "MANIFEST:".
    manifest = released.split("\nMANIFEST:\n", 1)[1]
    rendered = keyed(_templated(d) for d in _objects(manifest).values())
    applied = run_block(docs_block("Install in a cluster", "subres certs"), "kustomize")
    # After what `subres certs` says, the manifest.
    [_, built] = re.split(r"^(?=apiVersion:)", applied, maxsplit=1, flags=re.M)
    wanted = keyed(_kustomized(d) for d in _objects(built).values())
    # Two runs of `subres certs`, two CAs: the keys and certificates differ, nothing else.
    for objects in (rendered, wanted):
        secrets = [doc for key, doc in objects.items() if key[1] == "Secret"]
        assert len(secrets) == 3
        for secret in secrets:
            assert set(secret.pop("data")) == {"tls.crt", "tls.key", "ca.crt"}
        apiservice = objects[("apiregistration.k8s.io/v1", "APIService", "", APISERVICE)]
        assert apiservice["spec"].pop("caBundle")
    assert sorted(rendered) == sorted(wanted)
    for key, doc in wanted.items():
        assert rendered[key] == doc, key
