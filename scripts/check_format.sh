#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the project is formatted as
# .clang-format says (the test format.clang_format runs it in CI). Prints the
# files that are not, and the command that formats them; exits 1 if any.
#   CLANG_FORMAT=clang-format-14 scripts/check_format.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${CLANG_FORMAT:-clang-format}
if ! command -v "$tool" > /dev/null; then
  echo "check_format: '$tool' is not installed (scripts/setup.sh installs clang-format)" >&2
  exit 1
fi
mapfile -t files < <(find bench core examples launcher python tests torch -type f \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
bad=()
for f in "${files[@]}"; do
  if ! "$tool" --dry-run --Werror "$f" > /dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($("$tool" --version | head -1)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "format them with: $tool -i ${bad[*]}" >&2
  exit 1
fi
echo "check_format: all ${#files[@]} files are formatted"
