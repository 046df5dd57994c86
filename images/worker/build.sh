#!/bin/sh
# Build andon's worker image (docs/scale-out.md, Building the worker image).
#
#   images/worker/build.sh [--no-registry] [--engine podman|docker] [--tag REF] [--python X.Y]
#
# 1. A wheelhouse: andon's wheel (built from this checkout) and its dependencies' wheels for the
#    image's Python (--python, default 3.11) and this machine's architecture, from PyPI (or the
#    index pip is configured with), with the host's Python (PYTHON, default python3).
# 2. With --no-registry: a minimal Debian bookworm (python3 3.11, python3-venv) made by
#    debootstrap from a Debian package mirror (MIRROR, default deb.debian.org), imported as the
#    base image localhost/andon-base:bookworm. Needs root (debootstrap) and debootstrap itself
#    (apt-get install debootstrap). Without it the base is python:3.11-slim-bookworm, pulled from
#    the registry.
# 3. The image (default localhost/andon-worker:latest), built from Containerfile with no network:
#    everything it installs is in the wheelhouse.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
engine=podman
tag=localhost/andon-worker:latest
python_version=3.11
no_registry=false
base=
mirror=${MIRROR:-http://deb.debian.org/debian}
python=${PYTHON:-python3}  # the host's Python with pip, which makes the wheelhouse

while [ $# -gt 0 ]; do
    case "$1" in
        --no-registry) no_registry=true ;;
        --engine) engine=$2; shift ;;
        --tag) tag=$2; shift ;;
        --python) python_version=$2; shift ;;
        --base) base=$2; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

work=$(mktemp -d "${TMPDIR:-/tmp}/andon-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
context="$work/context"
mkdir -p "$context/wheelhouse"
cp "$here/Containerfile" "$context/Containerfile"

echo "== wheelhouse (Python $python_version, $(uname -m))"
# andon itself is pure Python: built here whatever this machine's Python is. Its dependencies
# are downloaded as binary wheels for the image's Python and architecture, not this machine's.
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$context/wheelhouse" "$source_dir"
arch=$(uname -m)
"$python" -m pip download --quiet --only-binary=:all: --dest "$context/wheelhouse" \
    --python-version "$python_version" --implementation cp \
    --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" \
    --platform "manylinux2014_$arch" --platform "manylinux1_$arch" \
    "$context"/wheelhouse/andon-*.whl

if $no_registry && [ -z "$base" ]; then
    base=localhost/andon-base:bookworm
    echo "== base image $base (debootstrap bookworm from $mirror)"
    rootfs="$work/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv \
        bookworm "$rootfs" "$mirror"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar --numeric-owner -C "$rootfs" -c . | "$engine" import - "$base"
fi

echo "== image $tag"
# --network none: the build installs from the wheelhouse only.
"$engine" build --network none ${base:+--build-arg "BASE=$base"} \
    --tag "$tag" --file "$context/Containerfile" "$context"
echo "built $tag"
