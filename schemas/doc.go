// Package schemas defines the records that travel between playpipe's roles,
// each versioned and each described by a JSON Schema document embedded here:
//
//   - PlayerEvent (v1), on <prefix>.events: one continuous listening segment of a mix;
//   - TrackPlay (v1), on <prefix>.reports: one track play derived from an event,
//     carrying the exact partner API report body;
//   - Rejection (v1), on <prefix>.rejected: an event that broke a rule, with its
//     raw bytes and machine-readable reasons;
//   - Delivery (v1), on <prefix>.deliveries: one answer of the partner API to a report.
//
// ParseEvent validates raw event bytes and returns every broken rule at once.
// All functions are safe for concurrent use.
package schemas
