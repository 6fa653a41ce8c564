#!/usr/bin/env python3
"""Validates SBOMs against the CycloneDX 1.5 JSON schema (strict: no property the schema does not define), as
published with cyclonedx-python-lib, and checks that each names the image it belongs to and lists the crate of
that image's binary.

  sbom-validate.py IMAGE BINARY_CRATE SBOM.cdx.json
"""

import json
import sys

from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator


def main() -> None:
    image, crate, path = sys.argv[1:4]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    error = JsonStrictValidator(SchemaVersion.V1_5).validate_str(text)
    if error is not None:
        sys.exit(f"{path}: not a valid CycloneDX 1.5 document: {error}")
    bom = json.loads(text)
    if bom["metadata"]["component"]["name"] != image:
        sys.exit(f"{path}: describes {bom['metadata']['component']['name']!r}, not the image {image!r}")
    if not any(c["name"] == crate for c in bom["components"]):
        sys.exit(f"{path}: does not list the crate {crate!r} of the image's binary")


if __name__ == "__main__":
    main()
