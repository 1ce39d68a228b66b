// Package sandbox is a faithful emulator of the music catalog's partner API
// (docs/partnerapi.md, "The partner API"; version 2.0.0 of the partner's specification): the far side of the boundary
// that package partnerapi is the client of. It is built like stripe-mock: the
// catalog is generated once from a seed, responses are encoded once at start,
// requests are validated exactly as the spec's tables say, and every error is
// answered with the spec's status, envelope, reason and message.
//
// What it promises:
//
//   - Every one of the nine endpoints, in live, standby and live-bypass mode,
//     behind an edge layer that blocks default script User-Agents (403, edge
//     error 1010) before anything else.
//   - Real HS256 JWT sessions with configurable live and standby lifetimes;
//     tokens minted in standby die when normal service resumes.
//   - A ledger of every play report it accepted (raw body, decoded fields,
//     arrival time, quality flags, duplicate marks), the standby-answered
//     reports kept apart, and counters per endpoint and status.
//   - Injectable faults per endpoint group (500/503 rates, latency, "fail the
//     next N"; for play reports a poison track, oversized bodies, and reports
//     held before their answer or a reset: one track, or a share at random),
//     switchable at run time from Go or from the admin API.
//
// Its wire types are its own: it never imports the client's Go types, so a
// mistake in one side's types cannot hide the same mistake in the other.
//
// A Server is safe for concurrent use. Its handlers hold no global lock while
// decoding or encoding JSON; the ledger is sharded. The Catalog returned by
// Server.Catalog is immutable and may be shared freely. Server has nothing to
// close: whoever serves Handler and AdminHandler owns the listeners.
package sandbox
