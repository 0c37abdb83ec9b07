-- 2fd0025: operator orders, live status (a branch without condition transitions)
BEGIN TRANSACTION;
CREATE TABLE applied_specs (
    deployment TEXT PRIMARY KEY,
    revision TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    versions TEXT NOT NULL,
    config TEXT NOT NULL
, backend TEXT);
INSERT INTO "applied_specs" VALUES('echo','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','eeeeeeeeeeeeeeee','[1]','{}',NULL);
CREATE TABLE footprints (
    server TEXT NOT NULL,
    model TEXT NOT NULL,
    bytes_per_version REAL NOT NULL,
    PRIMARY KEY (server, model)
);
INSERT INTO "footprints" VALUES('edge-a','echo',1000000.0);
CREATE TABLE holds (
    deployment TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    revision TEXT NOT NULL,
    reason TEXT NOT NULL,
    previous TEXT NOT NULL,
    configs TEXT NOT NULL,
    created_at REAL NOT NULL
, reverted TEXT);
INSERT INTO "holds" VALUES('scaler','ffffffffffffffff','bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb','analysis failed','{"edge-a": [1]}','{"edge-a": null}',1700000060.0,NULL);
CREATE TABLE live_status (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    snapshot TEXT NOT NULL
);
CREATE TABLE managed (
    server TEXT NOT NULL,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    PRIMARY KEY (server, model)
);
INSERT INTO "managed" VALUES('edge-a','echo','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa');
CREATE TABLE open_alerts (
    model TEXT NOT NULL,
    server TEXT NOT NULL,
    kind TEXT NOT NULL,
    revision TEXT NOT NULL,
    PRIMARY KEY (model, server, kind)
);
INSERT INTO "open_alerts" VALUES('scaler','edge-a','analysis-failed','bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb');
CREATE TABLE operator_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    verb TEXT NOT NULL,
    target TEXT NOT NULL,
    by TEXT NOT NULL,
    detail TEXT NOT NULL
);
INSERT INTO "operator_actions" VALUES(1,'2026-11-01T00:00:00Z','suspend','other','alice','');
CREATE TABLE operator_orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment TEXT NOT NULL,
    kind TEXT NOT NULL,
    by TEXT NOT NULL,
    at TEXT NOT NULL,
    at_epoch REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE passes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    revision TEXT NOT NULL,
    finished_at REAL NOT NULL,
    ok INTEGER NOT NULL,
    summary TEXT NOT NULL
);
INSERT INTO "passes" VALUES(1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',1700000000.0,1,'{"changes": []}');
INSERT INTO "passes" VALUES(2,'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb',1700000060.0,0,'{"n": 2}');
CREATE TABLE rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    revision TEXT NOT NULL,
    deployment TEXT NOT NULL,
    server TEXT NOT NULL,
    model TEXT NOT NULL,
    from_versions TEXT NOT NULL,
    to_versions TEXT NOT NULL,
    outcome TEXT NOT NULL,
    verdict TEXT,
    checks TEXT NOT NULL,
    error TEXT,
    rollback_seconds REAL,
    finished_at REAL NOT NULL
);
INSERT INTO "rollouts" VALUES(1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','echo','edge-a','echo','[]','[1]','converged','passed','[]',NULL,NULL,1700000000.0);
CREATE TABLE staged_rollouts (
    deployment TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    revision TEXT NOT NULL,
    progress TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE suspensions (
    target TEXT PRIMARY KEY,
    by TEXT NOT NULL,
    at TEXT NOT NULL,
    reason TEXT NOT NULL
);
INSERT INTO "suspensions" VALUES('other','alice','2026-11-01T00:00:00Z','');
CREATE TABLE undelivered_alerts (
    receiver TEXT PRIMARY KEY,
    deliveries TEXT NOT NULL
);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('passes',2);
INSERT INTO "sqlite_sequence" VALUES('rollouts',1);
INSERT INTO "sqlite_sequence" VALUES('operator_actions',1);
COMMIT;
