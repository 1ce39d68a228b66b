// Package expect computes, independently of the consumer's code, the
// track plays a player event must yield under docs/design.md's split rule, from
// the sandbox's own catalog: the oracle that end-to-end tests (demo,
// e2e/, e2e/docker/) compare the partner's ledger with. Test support only.
//
// Files: expect.go.
package expect
