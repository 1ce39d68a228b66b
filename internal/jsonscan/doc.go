// Package jsonscan is the validating, allocation-free JSON reader under the
// hand-written record decoders (analytics' ledger rows, the reporter's
// TrackPlay): one pass over the bytes of a record, no reflection.
//
// What it promises: a Scanner reads only what it is sure of, and gives up —
// Bad reports true, and every later call is a no-op — on anything else:
// invalid JSON, a value of another type than asked, a number that is not an
// integer of the asked size, a key with escapes or non-ASCII bytes, nesting
// deeper than MaxDepth, bytes after the top-level value. A caller whose
// Scanner went bad decodes the record with encoding/json instead, so the fast
// path never has to be right about an edge case, only to notice it.
//
// The Scanner is generic over its input (string or []byte): tokens and keys
// are slices of the input, never copies, and it allocates nothing. Whether a
// string value with escapes or invalid UTF-8 is decoded (with encoding/json)
// or makes the record fall back is the caller's choice: StrToken reports it.
package jsonscan
