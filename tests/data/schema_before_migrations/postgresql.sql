-- The store's schema as kassay's create_all made it before migrations existed (PostgreSQL).
-- Tests load it to check that `kassay db upgrade` adopts such a database.

CREATE TABLE artifacts (
	digest VARCHAR(64) NOT NULL, 
	filename VARCHAR(255) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	size INTEGER NOT NULL, 
	data BYTEA NOT NULL, 
	created_at FLOAT NOT NULL, 
	PRIMARY KEY (digest)
);

CREATE TABLE jobs (
	seq SERIAL NOT NULL, 
	id VARCHAR(40) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	labels JSON NOT NULL, 
	spec JSON NOT NULL, 
	idempotency_key VARCHAR(200), 
	body_hash VARCHAR(64), 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	finished_at FLOAT, 
	total INTEGER NOT NULL, 
	done INTEGER NOT NULL, 
	passed INTEGER NOT NULL, 
	failed INTEGER NOT NULL, 
	error INTEGER NOT NULL, 
	crashed INTEGER NOT NULL, 
	timeout INTEGER NOT NULL, 
	unsupported INTEGER NOT NULL, 
	skipped INTEGER NOT NULL, 
	cancel_requested BOOLEAN NOT NULL, 
	environments JSON NOT NULL, 
	PRIMARY KEY (seq), 
	UNIQUE (id), 
	UNIQUE (idempotency_key)
);

CREATE INDEX ix_jobs_name ON jobs (name);

CREATE INDEX ix_jobs_state ON jobs (state);

CREATE TABLE case_keys (
	job_id VARCHAR(40) NOT NULL, 
	case_id VARCHAR(200) NOT NULL, 
	key VARCHAR(40) NOT NULL, 
	job_seq INTEGER NOT NULL, 
	PRIMARY KEY (job_id, case_id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_case_keys_key_seq ON case_keys (key, job_seq);

CREATE TABLE cases (
	job_id VARCHAR(40) NOT NULL, 
	case_id VARCHAR(200) NOT NULL, 
	idx INTEGER NOT NULL, 
	group_id VARCHAR(64) NOT NULL, 
	impl VARCHAR(200) NOT NULL, 
	dtype VARCHAR(32) NOT NULL, 
	status VARCHAR(16), 
	result JSON, 
	seq INTEGER, 
	finished_at FLOAT, 
	PRIMARY KEY (job_id, case_id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_cases_job_group ON cases (job_id, group_id);

CREATE INDEX ix_cases_job_seq ON cases (job_id, seq);

CREATE TABLE comparisons (
	job_id VARCHAR(40) NOT NULL, 
	to_job_id VARCHAR(40), 
	created_at FLOAT NOT NULL, 
	result JSON, 
	note TEXT, 
	PRIMARY KEY (job_id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE TABLE groups (
	job_id VARCHAR(40) NOT NULL, 
	group_id VARCHAR(64) NOT NULL, 
	job_seq INTEGER NOT NULL, 
	idx INTEGER NOT NULL, 
	spec JSON NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	attempts INTEGER NOT NULL, 
	worker VARCHAR(200), 
	owner VARCHAR(64), 
	lease_expires_at FLOAT, 
	last_error TEXT, 
	PRIMARY KEY (job_id, group_id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_groups_queue ON groups (state, job_seq, idx);

CREATE TABLE job_artifacts (
	job_id VARCHAR(40) NOT NULL, 
	digest VARCHAR(64) NOT NULL, 
	idx INTEGER NOT NULL, 
	PRIMARY KEY (job_id, digest), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE, 
	FOREIGN KEY(digest) REFERENCES artifacts (digest)
);

CREATE INDEX ix_job_artifacts_digest ON job_artifacts (digest);

CREATE TABLE job_labels (
	job_id VARCHAR(40) NOT NULL, 
	key VARCHAR(200) NOT NULL, 
	value VARCHAR(1000) NOT NULL, 
	PRIMARY KEY (job_id, key), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_job_labels_kv ON job_labels (key, value);
