package schemas

// Headers of the records the reporter writes to <prefix>.deliveries.
//
// Besides Delivery records, the deliveries topic carries the reporter's
// lease markers: small records written (and acknowledged) before a batch
// of posts, so that after a crash the reporter knows which reports may have
// reached the partner without their answer being recorded. A lease marker
// has the HeaderLease header and no key; its value is not a Delivery.
// Readers of the topic other than the reporter skip records with that
// header (the ClickHouse sink does).
const (
	// HeaderSource is on every Delivery record the reporter writes: where
	// the report came from and what the answer means for it, as
	// "<partition>:<offset>:<flags>" of the <prefix>.reports record, flags
	// being "f" (final outcome) and/or "d" (the report is in doubt: an
	// earlier post of it may have reached the partner unrecorded), or "-".
	HeaderSource = "playpipe-src"
	// HeaderLease marks a lease marker; its value is the reporter's
	// consumer group.
	HeaderLease = "playpipe-lease"
)

// Lease is the value of a lease marker (JSON): the <prefix>.reports
// offsets of Partition that the reporter is about to post.
type Lease struct {
	V         int        `json:"v"`
	Partition int32      `json:"partition"`
	Offsets   [][2]int64 `json:"offsets"` // inclusive ranges, ascending
}
