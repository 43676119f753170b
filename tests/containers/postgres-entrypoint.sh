#!/bin/sh
# First start: a cluster whose superuser is POSTGRES_USER (password POSTGRES_PASSWORD) with a
# database POSTGRES_DB, as the official image makes; then the server in the foreground.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
  initdb --username="$POSTGRES_USER" --pwfile=/tmp/pwfile --auth=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
  PGPASSWORD="$POSTGRES_PASSWORD" psql -q -U "$POSTGRES_USER" -d postgres \
    -c "CREATE DATABASE \"$POSTGRES_DB\""
  pg_ctl -w stop >/dev/null
fi
exec postgres -c listen_addresses='*' -c unix_socket_directories=/tmp
