# Capstan's recipes. Each one is exactly what CI runs (.ci/run calls `just lint` and `just test`).

set shell := ["bash", "-euo", "pipefail", "-c"]

host_triple := `rustc -vV | sed -n 's/^host: //p'`

# List the recipes.
default:
    @just --list

# Install what the build and the tests need (idempotent): the wasm32-wasip2 target, Python test clients.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-wasip2/lib" ]; then
        rustup target add wasm32-wasip2 || ../shared/toolchain/install-wasm32-wasip2
    fi
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt || true
    python3 -c 'import standardwebhooks, httpx_sse, httpx' 2>/dev/null \
        || python3 -m pip install --quiet --disable-pip-version-check standardwebhooks httpx-sse httpx
    # schemathesis (`st`) fuzzes the live server from /v1/openapi.json (tests/tests/openapi.rs).
    python3 -c 'import schemathesis' 2>/dev/null && command -v st >/dev/null \
        || python3 -m pip install --quiet --disable-pip-version-check 'schemathesis==4.32.5'
    # Real servers of the provider tests (tests/tests/providers.rs): Knot DNS and Pebble.
    if ! command -v knotd >/dev/null 2>&1 && [ ! -x /usr/sbin/knotd ] || ! command -v kdig >/dev/null 2>&1 || ! command -v pebble >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq knot knot-dnsutils pebble >/dev/null
    fi
    # moto's server and boto3 for the AWS adapter tests (tests/tests/aws.rs), in a virtual
    # environment of their own so moto's pins stay out of the machine's Python.
    if [ ! -x target/venv-moto/bin/moto_server ]; then
        python3 -m venv target/venv-moto
        target/venv-moto/bin/pip install --quiet --disable-pip-version-check 'moto[server]==5.2.5'
    fi
    # The console's browser test (tests/tests/console.rs): Debian's Chromium and its driver,
    # driven by Selenium (which then downloads nothing).
    if ! command -v chromedriver >/dev/null 2>&1 || ! { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
    # promtool lints /metrics (tests/tests/metrics_and_audit.rs).
    if ! command -v promtool >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
    fi
    python3 -c 'import selenium' 2>/dev/null \
        || python3 -m pip install --quiet --disable-pip-version-check 'selenium==4.51.0'
    # pyenv only puts a new console script (`st`) on PATH after a rehash.
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi

# Build every guest component (release) and copy it where the host looks:
# workflows → target/workflows/<name>.wasm, fulfilment steps (workflows/steps/*) → target/steps/<name>.wasm,
# test fixtures → target/guest-fixtures/, examples → target/examples/.
build-guests: setup
    #!/usr/bin/env bash
    set -euo pipefail
    mkdir -p target/workflows target/steps target/guest-fixtures target/examples
    (cd workflows && cargo build --release --quiet)
    out=workflows/target/wasm32-wasip2/release
    for manifest in workflows/*/Cargo.toml; do
        crate=$(basename "$(dirname "$manifest")")
        cp "$out/${crate//-/_}.wasm" "target/workflows/$crate.wasm"
    done
    for manifest in workflows/steps/*/Cargo.toml; do
        crate=$(basename "$(dirname "$manifest")")
        cp "$out/${crate//-/_}.wasm" "target/steps/$crate.wasm"
    done
    for manifest in workflows/fixtures/*/Cargo.toml; do
        crate=fixture-$(basename "$(dirname "$manifest")")
        cp "$out/${crate//-/_}.wasm" "target/guest-fixtures/$crate.wasm"
    done
    for manifest in examples/*/Cargo.toml; do
        dir=$(dirname "$manifest"); crate=$(basename "$dir")
        (cd "$dir" && CARGO_TARGET_DIR=../../workflows/target cargo build --release --quiet)
        cp "$out/${crate//-/_}.wasm" "target/examples/$crate.wasm"
    done
    ls -1 target/workflows target/steps

# Guests and the release host binary.
build: build-guests
    cargo build --release -p capstan

# Serve both APIs on localhost with embedded SQLite, simulated providers and development secrets.
run: build
    #!/usr/bin/env bash
    set -euo pipefail
    if [ -z "${CAPSTAN_PEPPERS:-}" ]; then
        export CAPSTAN_PEPPERS="1:development-only-pepper-do-not-use-in-production"
        echo "just run: using a DEVELOPMENT pepper (set CAPSTAN_PEPPERS for anything real)" >&2
    fi
    if [ -z "${CAPSTAN_SECRET_KEYS:-}" ]; then
        export CAPSTAN_SECRET_KEYS="1:ZGV2ZWxvcG1lbnQtb25seS1rZXktZG8tbm90LXVzZSE="
        echo "just run: using a DEVELOPMENT webhook-secret key (set CAPSTAN_SECRET_KEYS for anything real)" >&2
    fi
    bin=./target/release/capstan
    for w in target/workflows/*.wasm; do
        $bin principals grant dev "workflows:$(basename "$w" .wasm)" 2>/dev/null
    done
    for p in principals:manage audit:read admin:read subscriptions:manage; do $bin principals grant dev "$p" 2>/dev/null; done
    key=$($bin api-keys mint --principal dev --expires-in-days 7)
    echo "just run: API key for principal 'dev' (valid 7 days): $key" >&2
    echo "just run: try  curl -s -H \"Authorization: Bearer $key\" localhost:8080/v1/executions" >&2
    echo "just run: console at http://localhost:8080/console/ (sign in with the key above)" >&2
    # Partner API: one booking partner per environment, created once and kept in data/ (dev only).
    keys=data/dev-partner-keys
    if [ ! -s "$keys" ]; then
        mkdir -p data && umask 077
        echo "production $($bin partners create --name dev-booking --type booking --environment production)" > "$keys"
        echo "sandbox $($bin partners create --name dev-sandbox --type booking --environment sandbox)" >> "$keys"
    fi
    pk=$(awk '$1=="production"{print $2}' "$keys"); tk=$(awk '$1=="sandbox"{print $2}' "$keys")
    echo "just run: partner keys (from $keys): production $pk (localhost:8080), sandbox $tk (localhost:8081)" >&2
    echo "just run: try  curl -s -H \"Partner-Auth: $pk\" 'localhost:8080/api/public/v2/products/?cityCode=ROME&limit=2'" >&2
    exec $bin serve

# The real provider path on localhost: Knot DNS (zone capstan.test, TSIG) and Pebble on free
# ports, and `capstan serve` on 127.0.0.1:8080 routed to them (docs/providers.md). Ctrl-C stops all.
run-real: build-guests
    just build-tests
    ./target/debug/real-path

# PostgreSQL for the tests (idempotent): installs Debian's server if missing, trusts 127.0.0.1, starts it, creates database `test`.
postgres:
    #!/usr/bin/env bash
    set -euo pipefail
    url="${CAPSTAN_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
    if command -v psql >/dev/null 2>&1 && psql "$url" -qtAc 'SELECT 1' >/dev/null 2>&1; then exit 0; fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    version=$(ls /etc/postgresql | sort -n | tail -n1)
    hba=/etc/postgresql/$version/main/pg_hba.conf
    grep -q 'capstan-test' "$hba" || sed -i '1i host all all 127.0.0.1/32 trust # capstan-test' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null \
        || pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    for _ in $(seq 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
    runuser -u postgres -- psql -qc 'CREATE DATABASE test' 2>/dev/null || true
    psql "$url" -qtAc 'SELECT 1' >/dev/null

# Every test: guest harness tests, host unit/integration and end-to-end tests on SQLite, then the PostgreSQL pass.
test: build-guests postgres
    (cd workflows && cargo test --quiet --target {{host_triple}})
    for m in examples/*/Cargo.toml; do (cd "$(dirname "$m")" && CARGO_TARGET_DIR=../../workflows/target cargo test --quiet --target {{host_triple}}); done
    (cd guest-sdk && CARGO_TARGET_DIR=../workflows/target cargo test --quiet --target {{host_triple}})
    (cd step-sdk && CARGO_TARGET_DIR=../workflows/target cargo test --quiet --target {{host_triple}})
    python3 examples/catalog/check.py examples/catalog/demo.json
    just build-tests
    rm -rf target/transitions-witness
    CAPSTAN_TRANSITIONS_WITNESS="$PWD/target/transitions-witness" cargo test --workspace --quiet
    just test-postgres
    python3 tests/clients/transitions_witness.py target/transitions-witness

# The test build: every test and the `capstan` binary the end-to-end tests spawn, in one
# invocation. `--all-targets` resolves features as `cargo test --workspace` does (dev-dependencies
# included); building `-p capstan` alone resolves some shared dependencies' features differently
# and so compiles the whole dependency graph a second time.
build-tests:
    cargo build --workspace --all-targets --quiet

# Every suite again on PostgreSQL (a schema per test; drops those of earlier test and bench runs).
test-postgres: postgres
    #!/usr/bin/env bash
    set -euo pipefail
    url="${CAPSTAN_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
    for schema in $(psql "$url" -qtAc "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'capstan\_t\_%' OR nspname LIKE 'capstan\_bench\_%'"); do
        psql "$url" -qc "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" >/dev/null
    done
    just build-tests
    # The whole workspace, so features unify as in the SQLite pass (no second build of the
    # dependencies); the tests that do not touch storage are quick and run again harmlessly.
    CAPSTAN_TRANSITIONS_WITNESS="$PWD/target/transitions-witness" CAPSTAN_TEST_DATABASE=postgres cargo test --workspace --quiet

# Formatting and clippy (warnings denied) on the host and the guests.
lint: setup
    cargo fmt --all --check
    (cd workflows && cargo fmt --all --check)
    (cd guest-sdk && cargo fmt --check)
    (cd step-sdk && cargo fmt --check)
    for m in examples/*/Cargo.toml; do (cd "$(dirname "$m")" && cargo fmt --check); done
    cargo clippy --workspace --all-targets --quiet -- -D warnings
    (cd workflows && cargo clippy --release --quiet -- -D warnings)

# Apply formatting everywhere.
fmt:
    cargo fmt --all
    (cd workflows && cargo fmt --all)
    (cd guest-sdk && cargo fmt)
    (cd step-sdk && cargo fmt)
    for m in examples/*/Cargo.toml; do (cd "$(dirname "$m")" && cargo fmt); done

# Benchmarks (release build; spawned `capstan serve` nodes): table + target/bench/results.json.
# `just bench --quick` is the smoke run CI executes; `just bench --only engine` one section;
# `just bench --runs 3` three runs, ending with each target's figure run by run.
bench *ARGS: build-guests postgres
    #!/usr/bin/env bash
    set -euo pipefail
    case " {{ARGS}} " in
        *" --quick "*)
            # The smoke run asserts only that the harness completes (and sells no seat twice):
            # it runs the test build, which `just test` has compiled, instead of a release build
            # of its own (21 min 34 s on a clean 2-core VM).
            just build-tests
            exec ./target/debug/capstan-bench --workflows target/workflows {{ARGS}} ;;
    esac
    # Without the AWS adapters (`--no-default-features`): the bench runs on the simulated cloud,
    # and the AWS SDK would be most of this release build.
    cargo build --release -p capstan -p capstan-bench --no-default-features
    exec ./target/release/capstan-bench --workflows target/workflows {{ARGS}}
