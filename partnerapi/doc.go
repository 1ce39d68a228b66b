// Package partnerapi is the client of the music catalog's partner API
// (shared/partner-api-spec.md): sessions, catalog discovery, mixes and play
// reports. Its sub-package sandbox is a faithful emulator of the same API.
package partnerapi
