#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/seed-*) from real objects: the
examples/ objects wrapped in AdmissionReviews as the API server sends them, the e2e fixtures'
kinds (Builds, build pods, Images), registry response shapes (manifests, indexes, error bodies,
WWW-Authenticate challenges), imgpkg bundle layers and their ImagesLock, vendir semver
selections, and Secrets as vendir reads them. Run from the repository root; idempotent."""

import base64, gzip, io, json, os, pathlib, tarfile, yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / f"seed-{name}").write_bytes(data)


def review(obj, resource, group, version, operation="CREATE", old=None, dry_run=False):
    meta = obj.get("metadata", {})
    req = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": version, "kind": obj.get("kind", "")},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": obj.get("kind", "")},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "demo"),
        "operation": operation,
        "userInfo": {"username": "admin", "groups": ["system:masters"]},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}, sort_keys=True)


ROUTES = {
    "App": ("apps", "kappctrl.k14s.io", "v1alpha1"),
    "PackageRepository": ("packagerepositories", "packaging.carvel.dev", "v1alpha1"),
    "Package": ("packages", "data.packaging.carvel.dev", "v1alpha1"),
    "Image": ("images", "kpack.io", "v1alpha2"),
    "Build": ("builds", "kpack.io", "v1alpha2"),
    "Pod": ("pods", "", "v1"),
}


def admission():
    n = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text().replace("REGISTRY", "registry.corp.com")):
            if not obj or obj.get("kind") not in ROUTES:
                continue
            resource, group, version = ROUTES[obj["kind"]]
            write("admission_review", f"{path.stem}-{n}", review(obj, resource, group, version))
            pinned = json.loads(json.dumps(obj))
            pinned.setdefault("metadata", {}).setdefault("annotations", {})["holdfast.dev/pin"] = "freeze"
            write("admission_review", f"{path.stem}-{n}-update", review(pinned, resource, group, version, "UPDATE", obj, True))
            n += 1
    uid = "3c5a6f9e-0000-4000-8000-000000000001"
    build = {"apiVersion": "kpack.io/v1alpha2", "kind": "Build", "metadata": {"name": "app-build-1", "namespace": "space", "labels": {"image.kpack.io/image": "app"}, "ownerReferences": [{"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "name": "app", "uid": uid, "controller": True}]}, "spec": {"tags": ["registry.example/app"]}}
    write("admission_review", "build", review(build, *ROUTES["Build"]))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app-build-1-build-pod", "namespace": "space", "labels": {"kpack.io/build": "app-build-1"}, "ownerReferences": [{"apiVersion": "kpack.io/v1alpha2", "kind": "Build", "name": "app-build-1", "uid": uid, "controller": True}]}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    write("admission_review", "pod", review(pod, *ROUTES["Pod"]))
    image = {"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "metadata": {"name": "ab", "namespace": "space", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"tag": "registry.example/ab"}}
    write("admission_review", "image-update", review(image, *ROUTES["Image"], "UPDATE", {**image, "spec": {"tag": "other"}}))


def references():
    for i, r in enumerate([
        "nginx", "nginx:1.25", "docker.io/library/nginx:latest", "index.docker.io/x/y",
        "registry.corp.com:5000/team/app-config:v1.2.0", "localhost/a/b/c:tag",
        "ghcr.io/corp/app@sha256:" + "ab" * 32, "[::1]:5000/repo:1", "127.0.0.1:5000/r@sha256:" + "0f" * 32,
        "registry.corp.com/team/app:1.0.0@sha256:" + "12" * 32,
    ]):
        write("reference", str(i), r)


def challenges():
    for i, c in enumerate([
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull"',
        'Basic realm="Registry Realm"',
        'Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:corp/app:pull",error="insufficient_scope"',
        'Basic realm="x"\nBearer realm="https://r.example/token", service=r.example',
        'Bearer realm=unquoted,scope="a b",service="s\\"q"',
    ]):
        write("www_authenticate", str(i), c)


def manifests():
    desc = lambda mt, seed, size: {"mediaType": mt, "digest": "sha256:" + seed * 32, "size": size}
    bodies = [
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": desc("application/vnd.oci.image.config.v1+json", "aa", 123), "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", "bb", 4567)], "annotations": {"org.opencontainers.image.created": "2026-01-01T00:00:00Z"}},
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{**desc("application/vnd.oci.image.manifest.v1+json", "cc", 700), "platform": {"architecture": "amd64", "os": "linux"}}]},
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json", "manifests": [desc("application/vnd.docker.distribution.manifest.v2+json", "dd", 528)]},
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "config": desc("application/vnd.docker.container.image.v1+json", "ee", 1469), "layers": [{**desc("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", "ff", 1), "urls": ["https://example.com/layer"]}]},
        {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown", "detail": {"Tag": "9.9.9"}}]},
        {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]},
    ]
    for i, b in enumerate(bodies):
        write("manifest", str(i), json.dumps(b))


LOCK = """apiVersion: imgpkg.carvel.dev/v1alpha1
kind: ImagesLock
images:
- image: registry.corp.com/team/app@sha256:{a}
  annotations:
    kbld.carvel.dev/id: registry.corp.com/team/app:1.0.0
- image: index.docker.io/library/nginx@sha256:{b}
""".format(a="ab" * 32, b="cd" * 32)


def tar_of(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def bundles():
    lock = LOCK.encode()
    layer = tar_of([(".imgpkg/bundle.yml", b"apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: Bundle\n"), (".imgpkg/images.yml", lock), ("config/app.yml", b"a: 1\n")])
    # The first byte is the chunk size the target feeds.
    write("bundle", "plain", b"\x40" + layer)
    write("bundle", "gzip", b"\x07" + gzip.compress(layer, mtime=0))
    write("bundle", "lock-only", b"\x01" + lock)
    write("bundle", "config", b"\xff" + json.dumps({"config": {"Labels": {"dev.carvel.imgpkg.bundle": ""}}}).encode())
    write("bundle", "long-name", b"\x10" + tar_of([("a/" * 60 + "images.yml", b"x"), ("./.imgpkg/images.yml", lock)]))


def semver():
    for i, s in enumerate([
        ">=1.0.0 <2.0.0\n1.0.0\n1.4.2\n2.0.0\n1.5.0-rc.1\nlatest",
        "~1.2\n1.2.0\n1.2.9\n1.3.0\nv1.2.5",
        "^0.3.x || >=2\n0.3.1\n0.4.0\n2.1.0-alpha.1+build.5",
        "1.x\n1.0\n1\n01.2.3\n1.2.3-0",
        "!=1.2.3, > 0.1\n1.2.3\n1.2.4",
    ]):
        write("semver", str(i), s)


def dockerconfigs():
    auth = base64.b64encode(b"robot$team:s3cr3t-token").decode()
    for i, c in enumerate([
        {"auths": {"registry.corp.com": {"auth": auth}}},
        {"auths": {"https://index.docker.io/v1/": {"username": "u", "password": "p", "email": "e@x"}}},
        {"auths": {"*.corp.com:5000": {"identitytoken": "tok"}, "ghcr.io": {"Auth": auth}}},
        {"Auths": {}},
        {"auths": {"r.io": {"auth": "dXNlcjpw#XNz"}}},
    ]):
        write("dockerconfigjson", str(i), json.dumps(c))


for make in (admission, references, challenges, manifests, bundles, semver, dockerconfigs):
    make()
