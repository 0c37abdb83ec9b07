-- d9a1bc2: managed models and passes
BEGIN TRANSACTION;
CREATE TABLE managed (
    server TEXT NOT NULL,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    PRIMARY KEY (server, model)
);
INSERT INTO "managed" VALUES('edge-a','echo','aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa');
CREATE TABLE passes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    revision TEXT NOT NULL,
    finished_at REAL NOT NULL,
    ok INTEGER NOT NULL,
    summary TEXT NOT NULL
);
INSERT INTO "passes" VALUES(1,'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',1700000000.0,1,'{"changes": []}');
INSERT INTO "passes" VALUES(2,'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb',1700000060.0,0,'{"n": 2}');
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('passes',2);
COMMIT;
