// Package schemas defines the records that travel between playpipe's roles,
// each versioned and each described by a JSON Schema document, a file
// *.schema.json of this directory:
//
//   - PlayerEvent (v1), on <prefix>.events: one continuous listening segment of a mix;
//   - TrackPlay (v1), on <prefix>.reports: one track play derived from an event,
//     carrying the exact partner API report body;
//   - Rejection (v1), on <prefix>.rejected: an event that broke a rule, with its
//     raw bytes and machine-readable reasons;
//   - Delivery (v1), on <prefix>.deliveries: one answer of the partner API to a report.
//
// It also holds PlayReport, the body of the partner API's play report that a
// TrackPlay carries, with its byte-exact encoder AppendReportJSON: the HTTP
// client (partnerapi) imports this package, never the reverse, and schemas
// imports nothing of playpipe.
//
// ParseEvent validates raw event bytes and returns every broken rule at once.
// Each record type has one decoder, used by every stage (DecodeTrackPlay,
// DecodeTrackPlayHead for a forwarder that posts the report's exact bytes,
// DecodeDelivery, DecodeRejection, DecodePlayerEvent): exactly
// json.Unmarshal's result, in one reflection-free pass in the plain case,
// and without copying strings when decoding from a string. AppendTrackPlay,
// AppendDelivery and AppendReportJSON encode byte for byte as encoding/json.
// All functions are safe for concurrent use.
package schemas
