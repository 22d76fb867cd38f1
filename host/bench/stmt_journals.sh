#!/bin/sh
# Which statements make SQLite open a statement journal.
#
# usage: host/bench/stmt_journals.sh < STATEMENTS
#
# STATEMENTS holds SQL statements (`$N` placeholders as the store writes them), each ended by a
# line holding only `;;`. The script builds a small program on the SQLite that `libsqlite3-sys`
# bundles (the amalgamation in cargo's registry, the version Cargo.lock pins), applies the SQLite
# migrations (host/store/migrations/sqlite) to an in-memory database with foreign keys on, as the
# server runs, and prepares each statement. It prints the prepared statement's
# `usesStmtJournal` (SQLite's internal flag, read by including the amalgamation): 1 when the
# statement runs in a transaction behind a statement journal, which copies every page the
# statement changes that the transaction had changed before it. BENCHMARKS.md
# ("Allocation: statement journals and frees across threads") says why it matters.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=$(awk '/^name = "libsqlite3-sys"$/ { getline; gsub(/"/, "", $3); print $3 }' "$repo/Cargo.lock")
amalgamation=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"libsqlite3-sys-$version"/sqlite3 | head -n 1)
[ -f "$amalgamation/sqlite3.c" ] || {
    echo "no sqlite3.c of libsqlite3-sys $version in cargo's registry: run cargo fetch" >&2
    exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/journals.c" <<'EOF'
#include "sqlite3.c"
#include <stdio.h>

static char *slurp(FILE *f) {
    size_t size = 0, cap = 1 << 16;
    char *text = malloc(cap);
    size_t n;
    while ((n = fread(text + size, 1, cap - size - 1, f)) > 0) {
        size += n;
        if (size + 1 == cap) text = realloc(text, cap *= 2);
    }
    text[size] = 0;
    return text;
}

int main(int argc, char **argv) {
    sqlite3 *db;
    char *error = 0;
    sqlite3_open(":memory:", &db);
    sqlite3_exec(db, "PRAGMA foreign_keys = ON", 0, 0, 0);
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == 0) {
            perror(argv[i]);
            return 1;
        }
        char *migration = slurp(f);
        fclose(f);
        if (sqlite3_exec(db, migration, 0, 0, &error) != SQLITE_OK) {
            fprintf(stderr, "%s: %s\n", argv[i], error);
            return 1;
        }
    }
    char *at = slurp(stdin);
    for (char *end; (end = strstr(at, "\n;;")) != 0; at = end + 3) {
        *end = 0;
        while (*at == '\n' || *at == ' ') at++;
        sqlite3_stmt *statement;
        if (sqlite3_prepare_v2(db, at, -1, &statement, 0) != SQLITE_OK) {
            printf("error %s: %.100s\n", sqlite3_errmsg(db), at);
            continue;
        }
        printf("%d %.100s\n", ((Vdbe *)statement)->usesStmtJournal, at);
        sqlite3_finalize(statement);
    }
    return 0;
}
EOF
cc -O0 -w -I"$amalgamation" -o "$work/journals" "$work/journals.c" -lm -lpthread -ldl
"$work/journals" $(ls "$repo"/host/store/migrations/sqlite/*.sql | sort)
