-- The Postgres store's layout at schema version 2, exactly as releases before version 3 of
-- the layout created it (migration steps 1 and 2), for the upgrade checks. `{schema}` is
-- replaced with the check's own schema.
CREATE SCHEMA "{schema}";
CREATE TABLE "{schema}".idem_schema_version (
  version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE "{schema}".idem_records (
  key            text PRIMARY KEY,
  fingerprint    text NOT NULL,
  tool           text NOT NULL,
  state          text NOT NULL,
  token          text NOT NULL,
  lease_until    bigint,
  created_at     bigint NOT NULL,
  updated_at     bigint NOT NULL,
  payload        text,
  message        text,
  downstream_ref text,
  result_expired boolean NOT NULL DEFAULT false,
  attempts       text NOT NULL DEFAULT '[]',
  tx_effect      boolean NOT NULL DEFAULT false,
  operation      text,
  read_backs     text NOT NULL DEFAULT '[]');
CREATE INDEX idem_records_state ON "{schema}".idem_records (state, created_at, key);
CREATE INDEX idem_records_leases ON "{schema}".idem_records (lease_until) WHERE state = 'running';
CREATE INDEX idem_records_retention ON "{schema}".idem_records (updated_at)
  WHERE state IN ('completed', 'failed');
INSERT INTO "{schema}".idem_schema_version (version) VALUES (1);
CREATE TABLE "{schema}".idem_releases (
  key         text NOT NULL,
  seq         bigint NOT NULL,
  released_at bigint NOT NULL,
  entry       text NOT NULL,
  PRIMARY KEY (key, seq));
CREATE INDEX idem_releases_by_time ON "{schema}".idem_releases (released_at, key, seq);
INSERT INTO "{schema}".idem_schema_version (version) VALUES (2);
