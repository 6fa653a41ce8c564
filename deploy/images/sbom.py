#!/usr/bin/env python3
"""Writes the CycloneDX 1.5 SBOM (JSON) of one image: the Rust crates compiled into its binary and the Debian
packages whose files the image carries (shared libraries, the CA bundle).

  sbom.py --image NAME --version TAG --created EPOCH --crates CARGO_TREE_OUTPUT [--deb PACKAGE=VERSION ...]

CARGO_TREE_OUTPUT is `cargo tree -e normal,no-proc-macro --prefix none --format '{p}<TAB>{l}'` for the binary's
package, features and target (deploy/images/stage.sh); a crate with a path source is one of the workspace's own.
The output depends only on its inputs (no clock, no random serial number, components sorted), so an image built
twice carries the same file and keeps one digest.
"""

import argparse
import datetime
import json
import re
import sys
import urllib.parse

# "name v1.2.3", then " (/path)" for a path crate, " (proc-macro)", " (*)" for a repeat, in that order.
CRATE = re.compile(r"^(?P<name>\S+) v(?P<version>\S+)(?P<rest>.*)$")


def quote(version: str) -> str:
    # A package URL percent-encodes "+" and the like in a version ("1.1.3+spec-1.1.0", "20230311+deb12u1").
    return urllib.parse.quote(version, safe=".-_~")


def spdx(expression: str) -> str:
    # Old manifests separate alternatives with "/" ("MIT/Apache-2.0"); SPDX spells it " OR ".
    return " OR ".join(part.strip() for part in expression.split("/")) if "/" in expression else expression


def crates(path: str) -> list[dict]:
    seen: dict[tuple[str, str], dict] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            line = line.rstrip("\n")
            if not line:
                continue
            package, _, license_ = line.partition("\t")
            match = CRATE.match(package)
            if match is None:
                sys.exit(f"sbom.py: cannot read the crate of cargo tree's line {line!r}")
            name, version = match["name"], match["version"]
            rest = match["rest"].replace(" (*)", "").replace(" (proc-macro)", "").strip()
            own = rest.startswith("(/") or rest.startswith("(.")
            component: dict = {"type": "library", "name": name, "version": version}
            if own:
                # The workspace's own crates are not published: no package URL, a local reference instead.
                component["bom-ref"] = f"workspace:{name}@{version}"
                component["properties"] = [{"name": "peerpods:source", "value": "workspace"}]
            else:
                component["bom-ref"] = component["purl"] = f"pkg:cargo/{name}@{quote(version)}"
            license_ = license_.replace(" (*)", "").strip()
            if license_:
                component["licenses"] = [{"expression": spdx(license_)}]
            seen[(name, version)] = component
    return [seen[key] for key in sorted(seen)]


def debs(specs: list[str], distro: str) -> list[dict]:
    out = []
    for spec in sorted(set(specs)):
        name, _, version = spec.partition("=")
        if not version:
            sys.exit(f"sbom.py: --deb {spec!r} is not PACKAGE=VERSION")
        purl = f"pkg:deb/debian/{name}@{quote(version)}?arch=amd64"
        if distro:
            purl += f"&distro={distro}"
        out.append({"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--created", required=True, type=int, help="seconds since the epoch (SOURCE_DATE_EPOCH)")
    parser.add_argument("--crates", required=True)
    parser.add_argument("--deb", action="append", default=[])
    parser.add_argument("--distro", default="", help="e.g. debian-12, the packages' release")
    args = parser.parse_args()

    created = datetime.datetime.fromtimestamp(args.created, tz=datetime.timezone.utc)
    image = {"type": "container", "bom-ref": f"image:{args.image}", "name": args.image, "version": args.version}
    components = crates(args.crates) + debs(args.deb, args.distro)
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {"timestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"), "component": image},
        "components": components,
        "dependencies": [{"ref": image["bom-ref"], "dependsOn": [c["bom-ref"] for c in components]}],
    }
    json.dump(bom, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
