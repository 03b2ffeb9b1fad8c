-- The SQLite store's layout at schema version 1, exactly as releases before version 2
-- created it (with the release traces table it gained within version 1), for the upgrade
-- checks.
CREATE TABLE idem_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value ANY NOT NULL
) STRICT;
CREATE TABLE idem_records (
    key            TEXT PRIMARY KEY NOT NULL,
    state          TEXT NOT NULL,
    fingerprint    TEXT NOT NULL,
    tool           TEXT NOT NULL,
    token          TEXT NOT NULL,
    lease_until    INTEGER,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    result_expired INTEGER NOT NULL,
    payload        TEXT,
    message        TEXT,
    downstream_ref TEXT,
    attempts       TEXT NOT NULL,
    operation      TEXT,
    read_backs     TEXT NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX idem_records_by_state ON idem_records (state, created_at, key);
CREATE INDEX idem_records_by_age ON idem_records (state, result_expired, updated_at);
CREATE TABLE idem_releases (
    key         TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    released_at INTEGER NOT NULL,
    entry       TEXT NOT NULL,
    PRIMARY KEY (key, seq)
) STRICT, WITHOUT ROWID;
CREATE INDEX idem_releases_by_time ON idem_releases (released_at, key, seq);
INSERT INTO idem_meta (name, value) VALUES ('schema_version', 1);
