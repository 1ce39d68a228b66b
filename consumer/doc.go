// Package consumer is playpipe's enrich role: it reads player events from
// <prefix>.events in a consumer group, splits each listening segment into
// per-track plays with the mix's track listing (the split rule of docs/design.md,
// see Split), and writes the plays to <prefix>.reports or the event with its
// reasons to <prefix>.rejected.
//
// Promises:
//
//   - Exactly once: every produced record and the consumer group's offset
//     commit go into one Kafka transaction (franz-go GroupTransactSession), so
//     with read_committed downstream a crash or rebalance never loses or
//     doubles a track play. A transaction holds up to Config.TxnRecords
//     events or Config.TxnInterval of work.
//   - Determinism: the same event always yields the same plays with the same
//     report ids (schemas.ReportID(event_id, position)); isrc is copied byte
//     for byte from the listing.
//   - An event is never dropped silently: it yields plays, or a rejection
//     with machine-readable reasons. A mix unknown to the partner API (404)
//     rejects the event as unknown_mix; a 500, 503 or network error is
//     retried with backoff, never turned into a rejection, while only the
//     events of that mix (and later events of their keys) are held and
//     every other event flows on (hold.go: the committed offsets stop at
//     the oldest held event, and commit metadata lists what was produced
//     past it, so a restart neither loses nor doubles); a 400 or undecodable answer is retried until a bounded
//     policy (CacheConfig.UnavailableAttempts) rejects the mix's events as
//     mix_unavailable.
//   - Nothing stalls a partition for good: events over Config.MaxEventBytes
//     are rejected too_large; rejection records are bounded
//     (schemas.MaxRejectionRaw); an event whose outputs Kafka refuses for
//     themselves is retried on its own Config.MaxProduceAttempts times, then
//     rejected as produce_failed.
//   - A segment past the mix end is a valid event with zero plays
//     (Stats.WithoutPlays), not a rejection.
//   - MixCache fetches each mix once however many events wait for it
//     (single flight), keeps a bounded number of listings (LRU) for a TTL,
//     and keeps listings served by the API's standby layer for a shorter TTL.
//
// Split and PrepareListing are pure and safe for concurrent use (the track
// play records are encoded by schemas.AppendTrackPlay); MixCache is safe for
// concurrent use; an Enricher runs one Run at a time.
package consumer
