-- migration 1 (ledger tables), statement 1
CREATE TABLE IF NOT EXISTS {db}.events (
    kafka_topic LowCardinality(String),
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),
    kafka_key String,
    trace_id String,
    parsed UInt8,
    event_id String,
    mix_id Int64,
    started_at_ms Int64,
    offset_ms Int64,
    duration_ms Int64,
    user_id String,
    country LowCardinality(String),
    raw String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (kafka_time_ms, kafka_topic, kafka_partition, kafka_offset);

-- migration 1 (ledger tables), statement 2
CREATE TABLE IF NOT EXISTS {db}.plays (
    kafka_topic LowCardinality(String),
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),
    trace_id String,
    v Int32,
    report_id String,
    event_id String,
    mix_id Int64,
    position Int32,
    overlap_ms Int64,
    below_minimum UInt8,
    no_user_id UInt8,
    standby_listing UInt8,
    derived_at_ms Int64,
    track_id Int64,
    played_at_ms Int64,
    play_length Int64,
    user_id String,
    country LowCardinality(String),
    isrc String,
    record String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (report_id, kafka_topic, kafka_partition, kafka_offset);

-- migration 1 (ledger tables), statement 3
CREATE TABLE IF NOT EXISTS {db}.deliveries (
    kafka_topic LowCardinality(String),
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),
    v Int32,
    report_id String,
    event_id String,
    outcome LowCardinality(String),
    attempt Int32,
    http_status Int32,
    served_by LowCardinality(String),
    message String,
    fields Array(String),
    retry_reason LowCardinality(String),
    latency_us Int64,
    trace_id String,
    replay UInt8,
    at_ms Int64
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (report_id, kafka_topic, kafka_partition, kafka_offset);

-- migration 1 (ledger tables), statement 4
CREATE TABLE IF NOT EXISTS {db}.rejections (
    kafka_topic LowCardinality(String),
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),
    trace_id String,
    v Int32,
    event_id String,
    reason LowCardinality(String),
    violation_reasons Array(String),
    violation_fields Array(String),
    violation_details Array(String),
    src_topic LowCardinality(String),
    src_partition Int32,
    src_offset Int64,
    at_ms Int64,
    raw String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (kafka_time_ms, kafka_topic, kafka_partition, kafka_offset);

-- migration 1 (ledger tables), statement 5
CREATE TABLE IF NOT EXISTS {db}.malformed (
    kafka_topic LowCardinality(String),
    kafka_partition Int32,
    kafka_offset Int64,
    kafka_time DateTime,
    kafka_time_ms UInt64,
    inserted_at DateTime DEFAULT now(),
    kafka_key String,
    error String,
    raw String
) ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(kafka_time)
ORDER BY (kafka_topic, kafka_partition, kafka_offset);

-- migration 2 (deliveries.partner), statement 1
ALTER TABLE {db}.deliveries ADD COLUMN partner LowCardinality(String) DEFAULT '';

-- migration 3 (deliveries.in_doubt), statement 1
ALTER TABLE {db}.deliveries ADD COLUMN in_doubt UInt8 DEFAULT 0;

-- migration 4 (deliveries.replay_id), statement 1
ALTER TABLE {db}.deliveries ADD COLUMN replay_id String DEFAULT '';

-- migration 4 (deliveries.replay_id), statement 2
ALTER TABLE {db}.deliveries ADD COLUMN replay_reason String DEFAULT '';

-- migration 5 (deliveries.doubt_cause), statement 1
ALTER TABLE {db}.deliveries ADD COLUMN doubt_cause String DEFAULT '';

-- migration 6 (kafka_topic_id), statement 1
ALTER TABLE {db}.events ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY (kafka_time_ms, kafka_topic, kafka_partition, kafka_offset, kafka_topic_id);

-- migration 6 (kafka_topic_id), statement 2
ALTER TABLE {db}.plays ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY (report_id, kafka_topic, kafka_partition, kafka_offset, kafka_topic_id);

-- migration 6 (kafka_topic_id), statement 3
ALTER TABLE {db}.deliveries ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY (report_id, kafka_topic, kafka_partition, kafka_offset, kafka_topic_id);

-- migration 6 (kafka_topic_id), statement 4
ALTER TABLE {db}.rejections ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY (kafka_time_ms, kafka_topic, kafka_partition, kafka_offset, kafka_topic_id);

-- migration 6 (kafka_topic_id), statement 5
ALTER TABLE {db}.malformed ADD COLUMN kafka_topic_id String AFTER kafka_offset, MODIFY ORDER BY (kafka_topic, kafka_partition, kafka_offset, kafka_topic_id);

-- migration 6 (kafka_topic_id), statement 6
ALTER TABLE {db}.rejections ADD COLUMN src_topic_id String DEFAULT '' AFTER src_offset;

-- migration 7 (report_state), statement 1
CREATE TABLE IF NOT EXISTS {db}.report_state (
    report_id String,
    delivered_n_s AggregateFunction(uniqExactIf, UInt64, UInt8),
    replay_delivered_n_s AggregateFunction(uniqExactIf, UInt64, UInt8),
    rejected_n_s AggregateFunction(max, UInt8),
    standby_n_s AggregateFunction(max, UInt8),
    parked_n_s AggregateFunction(max, UInt8),
    doubt_delivered_s AggregateFunction(maxIf, UInt8, UInt8),
    doubt_n_s AggregateFunction(uniqExactIf, UInt64, UInt8),
    replay_doubt_n_s AggregateFunction(uniqExactIf, UInt64, UInt8),
    delivered_ms_s AggregateFunction(minIf, Int64, UInt8),
    replayed_s AggregateFunction(max, UInt8),
    reject_message_s AggregateFunction(anyIf, String, UInt8)
) ENGINE = AggregatingMergeTree
ORDER BY report_id;

-- migration 7 (report_state), statement 2
CREATE TABLE IF NOT EXISTS {db}.backfills (
    name String,
    slice String,
    done_at DateTime
) ENGINE = ReplacingMergeTree
ORDER BY (name, slice);

-- migration 7 (report_state), statement 3
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.report_state_mv TO {db}.report_state AS SELECT report_id, uniqExactIfState(cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset), outcome = 'delivered' AND replay_id = '') AS delivered_n_s, uniqExactIfState(cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset), outcome = 'delivered' AND replay_id != '') AS replay_delivered_n_s, maxState(toUInt8(outcome = 'rejected')) AS rejected_n_s, maxState(toUInt8(outcome = 'standby')) AS standby_n_s, maxState(toUInt8(outcome = 'parked')) AS parked_n_s, maxIfState(in_doubt, outcome = 'delivered' AND replay_id = '') AS doubt_delivered_s, uniqExactIfState(cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset), doubt_cause != '' AND replay_id = '') AS doubt_n_s, uniqExactIfState(cityHash64(kafka_topic_id, toString(kafka_topic), kafka_partition, kafka_offset), doubt_cause != '' AND replay_id != '') AS replay_doubt_n_s, minIfState(at_ms, outcome = 'delivered') AS delivered_ms_s, maxState(toUInt8(replay_id != '')) AS replayed_s, anyIfState(message, outcome = 'rejected') AS reject_message_s FROM {db}.deliveries GROUP BY report_id;

-- migration 8 (drop report_state), statement 1
DROP TABLE IF EXISTS {db}.report_state_mv;

-- migration 8 (drop report_state), statement 2
DROP TABLE IF EXISTS {db}.report_state;

-- migration 8 (drop report_state), statement 3
DROP TABLE IF EXISTS {db}.backfills;

-- migration 9 (plays.event_at_ms), statement 1
ALTER TABLE {db}.plays ADD COLUMN event_at_ms UInt64 DEFAULT 0;

