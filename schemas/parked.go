package schemas

import "encoding/json"

// ParkedVersion is the version of the Parked records this build writes.
const ParkedVersion = 1

// Parked is the state of one parked report (topic <prefix>.parked,
// compacted, key = report id, partition = the report's partition in
// <prefix>.reports; a record without a value — a tombstone — says the
// report left the lot: delivered, rejected or re-sent by an operator).
// Written by the reporter when it parks a report and around each slow
// retry, and by `playpipe redrive --parked` when it re-sent one.
type Parked struct {
	V        int    `json:"v"`
	ReportID string `json:"report_id"`
	EventID  string `json:"event_id"`
	// Source is where the report lies in <prefix>.reports.
	Source Source `json:"source"`
	// Report is the exact body to POST (the track play's report object).
	Report json.RawMessage `json:"report"`
	// Attempts is how many posts of the report were made so far; Stage how
	// many slow retries failed (0 when it was just parked); Due when the
	// next slow retry is due (epoch ms).
	Attempts int   `json:"attempts"`
	Stage    int   `json:"stage"`
	Due      int64 `json:"due"`
	// The last answer: HTTP status (0 without one), retry reason, message.
	Status  int    `json:"http_status"`
	Reason  string `json:"retry_reason,omitempty"`
	Message string `json:"message,omitempty"`
	// InDoubt: a post of the report may have reached the partner without a
	// recorded answer; every later Delivery record of it says so.
	InDoubt bool `json:"in_doubt,omitempty"`
	// Posting: a slow retry's post was about to start. A reader that finds
	// it set (the writer stopped mid-retry) posts again labelled in doubt.
	Posting bool `json:"posting,omitempty"`
	// Doubt is the cause (a Doubt* of records.go) of a post with no record
	// of its own — a slow retry's post cancelled after its request left
	// (shutdown, revocation): DoubtCancelled. The report's next post
	// carries it; empty otherwise.
	Doubt string `json:"doubt,omitempty"`
	// ParkedAt is when the report was first parked (epoch ms).
	ParkedAt int64 `json:"parked_at"`
}

// RedriveKeyPrefix starts the key of a redrive request in
// <prefix>.parked: "redrive:<report id>" (the report's own entry is keyed
// by its bare id, so a request never replaces the entry).
const RedriveKeyPrefix = "redrive:"

// RedriveRequest asks the owner of a parked report — the reporter that owns
// its partition of <prefix>.reports — to post it now, for an operator's
// `playpipe redrive --parked` (topic <prefix>.parked, key
// RedriveKeyPrefix + report id, in the partition kafkax.ParkedPartition
// gives for Partition). The owner's slow lane is the report's one poster:
// it posts the report at once, its Delivery record carrying ReplayID and
// Reason, and then removes the request (a tombstone of its key) — also
// when the report is no longer parked (final already): nothing is posted
// then. A request outlives the redrive that wrote it: an interrupted
// redrive's requests are still served once.
type RedriveRequest struct {
	V        int    `json:"v"`
	ReportID string `json:"report_id"`
	// Partition is the report's partition in <prefix>.reports.
	Partition int32  `json:"partition"`
	ReplayID  string `json:"replay_id"`
	Reason    string `json:"replay_reason"`
	At        int64  `json:"at"` // epoch ms of the request
}
