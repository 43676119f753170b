# Sourced by scripts/serve and scripts/test: makes .venv with Python 3.11+ and installs the
# project into it, again only when pyproject.toml has changed since the last install.
find_python() {
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "postroom: Python 3.11 or newer is needed; install python3.11" >&2
  return 1
}

# `ensure_venv dev` adds pyproject.toml's `dev` extra; `ensure_venv` alone installs the service.
ensure_venv() {
  local extras="${1:-}" stamp=".venv/.installed-${1:-service}" target="."
  if [ -n "$extras" ]; then target=".[$extras]"; fi
  if [ ! -x .venv/bin/python ]; then
    echo "postroom: creating .venv" >&2
    "$(find_python)" -m venv .venv
  fi
  local want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "postroom: installing dependencies into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target"
    echo "$want" >"$stamp"
  fi
}
