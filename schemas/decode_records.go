package schemas

// DecodeDelivery decodes the Delivery record s into d (see the decoders'
// contract in decode.go: exactly json.Unmarshal, one pass in the plain case,
// zero-copy over a string).
func DecodeDelivery[S string | []byte](s S, d *Delivery) error {
	if fastDelivery(s, d) {
		return nil
	}
	*d = Delivery{}
	return unmarshal(s, d)
}

// fastDelivery is the one-pass decoder of DecodeDelivery: true when it took
// s, false (with *d in any state) when encoding/json must decide.
func fastDelivery[S string | []byte](s S, d *Delivery) bool {
	*d = Delivery{}
	p, seen := newJSONScanner(s), uint32(0)
	for first := p.Open('{'); p.More('}', &first); {
		deliveryMember(&p, p.Key(), d, &seen)
	}
	return p.End()
}

func deliveryMember[S string | []byte](p *jsonScanner[S], k S, d *Delivery, seen *uint32) {
	switch string(k) {
	case "v":
		if p.Once(seen, 1<<0) {
			p.Int(&d.V)
		}
	case "attempt":
		if p.Once(seen, 1<<1) {
			p.Int(&d.Attempt)
		}
	case "http_status":
		if p.Once(seen, 1<<2) {
			p.Int(&d.HTTPStatus)
		}
	case "latency_us":
		if p.Once(seen, 1<<3) {
			p.Int64(&d.LatencyUS)
		}
	case "at":
		if p.Once(seen, 1<<4) {
			p.Int64(&d.At)
		}
	case "replay":
		if p.Once(seen, 1<<5) {
			p.Bool(&d.Replay)
		}
	case "in_doubt":
		if p.Once(seen, 1<<6) {
			p.Bool(&d.InDoubt)
		}
	case "fields":
		if p.Once(seen, 1<<7) {
			p.StrList(&d.Fields)
		}
	default:
		if dst, bit := deliveryStr(d, k); dst != nil {
			if p.Once(seen, bit) {
				p.Str(dst)
			}
			return
		}
		p.Unknown(k, deliveryKeys...)
	}
}

// deliveryStr returns the string field of d named k and its
// duplicate-detection bit, or nil.
func deliveryStr[S string | []byte](d *Delivery, k S) (*string, uint32) {
	switch string(k) {
	case "report_id":
		return &d.ReportID, 1 << 8
	case "event_id":
		return &d.EventID, 1 << 9
	case "outcome":
		return &d.Outcome, 1 << 10
	case "served_by":
		return &d.ServedBy, 1 << 11
	case "partner":
		return &d.Partner, 1 << 12
	case "message":
		return &d.Message, 1 << 13
	case "retry_reason":
		return &d.Reason, 1 << 14
	case "trace_id":
		return &d.TraceID, 1 << 15
	case "replay_id":
		return &d.ReplayID, 1 << 16
	case "replay_reason":
		return &d.ReplayReason, 1 << 17
	case "doubt_cause":
		return &d.DoubtCause, 1 << 18
	}
	return nil, 0
}

// DecodeRejection decodes the Rejection record s into j (see the decoders'
// contract in decode.go).
func DecodeRejection[S string | []byte](s S, j *Rejection) error {
	if fastRejection(s, j) {
		return nil
	}
	*j = Rejection{}
	return unmarshal(s, j)
}

// fastRejection is the one-pass decoder of DecodeRejection: true when it took
// s, false (with *j in any state) when encoding/json must decide.
func fastRejection[S string | []byte](s S, j *Rejection) bool {
	*j = Rejection{}
	p, seen := newJSONScanner(s), uint32(0)
	for first := p.Open('{'); p.More('}', &first); {
		rejectionMember(&p, p.Key(), j, &seen)
	}
	return p.End()
}

func rejectionMember[S string | []byte](p *jsonScanner[S], k S, j *Rejection, seen *uint32) {
	switch string(k) {
	case "v":
		if p.Once(seen, 1<<0) {
			p.Int(&j.V)
		}
	case "event_id":
		if p.Once(seen, 1<<1) {
			p.Str(&j.EventID)
		}
	case "reason":
		if p.Once(seen, 1<<2) {
			p.Str(&j.Reason)
		}
	case "violations":
		if p.Once(seen, 1<<3) {
			violations(p, &j.Violations)
		}
	case "raw":
		if p.Once(seen, 1<<4) {
			p.Str(&j.Raw)
		}
	case "raw_base64":
		if p.Once(seen, 1<<5) {
			p.Bool(&j.RawBase64)
		}
	case "source":
		if p.Once(seen, 1<<6) && !p.Null() {
			source(p, &j.Source)
		}
	case "at":
		if p.Once(seen, 1<<7) {
			p.Int64(&j.At)
		}
	case "raw_len":
		if p.Once(seen, 1<<8) {
			p.Int(&j.RawLen)
		}
	case "raw_sha256":
		if p.Once(seen, 1<<9) {
			p.Str(&j.RawSHA256)
		}
	case "raw_truncated":
		if p.Once(seen, 1<<10) {
			p.Bool(&j.RawTruncated)
		}
	default:
		p.Unknown(k, rejectionKeys...)
	}
}

// violations decodes a list of violations (null: nil; [] an empty slice);
// a null element (or anything but an object) makes the scanner bad.
func violations[S string | []byte](p *jsonScanner[S], dst *[]Violation) {
	if p.Bad() {
		return
	}
	if p.Null() {
		*dst = nil
		return
	}
	out := []Violation{}
	if !p.Open('[') {
		return
	}
	for first := true; p.More(']', &first); {
		var v Violation
		var seen uint32
		if !p.Open('{') {
			return
		}
		for first := true; p.More('}', &first); {
			switch k := p.Key(); string(k) {
			case "field":
				if p.Once(&seen, 1) {
					p.Str(&v.Field)
				}
			case "reason":
				if p.Once(&seen, 2) {
					p.Str(&v.Reason)
				}
			case "detail":
				if p.Once(&seen, 4) {
					p.Str(&v.Detail)
				}
			default:
				p.Unknown(k, violationKeys...)
			}
		}
		out = append(out, v)
	}
	*dst = out
}

func source[S string | []byte](p *jsonScanner[S], dst *Source) {
	var seen uint32
	if !p.Open('{') {
		return
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); string(k) {
		case "topic":
			if p.Once(&seen, 1) {
				p.Str(&dst.Topic)
			}
		case "partition":
			if p.Once(&seen, 2) {
				p.Int32(&dst.Partition)
			}
		case "offset":
			if p.Once(&seen, 4) {
				p.Int64(&dst.Offset)
			}
		default:
			p.Unknown(k, sourceKeys...)
		}
	}
}

// eventOptionals backs the optional fields of a decoded PlayerEvent: one
// allocation for the four pointers.
type eventOptionals struct {
	vendor, endReason   int64
	cached, jumpForward bool
}

// DecodePlayerEvent decodes the player event s into ev as it is, without
// validating it (see the decoders' contract in decode.go): the reading of
// an event whatever rules it breaks, for the ledger. ParseEvent is the
// validating reading, with every broken rule.
func DecodePlayerEvent[S string | []byte](s S, ev *PlayerEvent) error {
	if fastPlayerEvent(s, ev) {
		return nil
	}
	*ev = PlayerEvent{}
	return unmarshal(s, ev)
}

// fastPlayerEvent is the one-pass decoder of DecodePlayerEvent: true when it
// took s, false (with *ev in any state) when encoding/json must decide.
func fastPlayerEvent[S string | []byte](s S, ev *PlayerEvent) bool {
	*ev = PlayerEvent{}
	p, seen := newJSONScanner(s), uint32(0)
	var opt *eventOptionals
	for first := p.Open('{'); p.More('}', &first); {
		eventMember(&p, p.Key(), ev, &seen, &opt)
	}
	return p.End()
}

func eventMember[S string | []byte](p *jsonScanner[S], k S, ev *PlayerEvent, seen *uint32, opt **eventOptionals) {
	optional := func() *eventOptionals {
		if *opt == nil {
			*opt = new(eventOptionals)
		}
		return *opt
	}
	switch string(k) {
	case "mix_id", "started_at", "offset_ms", "duration_ms":
		dst, bit := eventInt(ev, k)
		if p.Once(seen, bit) {
			p.Int64(dst)
		}
	case "vendor":
		if p.Once(seen, 1<<4) {
			ev.Vendor = optInt(p, &optional().vendor)
		}
	case "end_reason":
		if p.Once(seen, 1<<5) {
			ev.EndReason = optInt(p, &optional().endReason)
		}
	case "cached":
		if p.Once(seen, 1<<6) {
			ev.Cached = optBool(p, &optional().cached)
		}
	case "jump_forward":
		if p.Once(seen, 1<<7) {
			ev.JumpForward = optBool(p, &optional().jumpForward)
		}
	default:
		if dst, bit := eventStr(ev, k); dst != nil {
			if p.Once(seen, bit) {
				p.Str(dst)
			}
			return
		}
		p.Unknown(k, eventKeys...)
	}
}

func eventInt[S string | []byte](ev *PlayerEvent, k S) (*int64, uint32) {
	switch string(k) {
	case "mix_id":
		return &ev.MixID, 1 << 0
	case "started_at":
		return &ev.StartedAt, 1 << 1
	case "offset_ms":
		return &ev.OffsetMS, 1 << 2
	}
	return &ev.DurationMS, 1 << 3
}

func eventStr[S string | []byte](ev *PlayerEvent, k S) (*string, uint32) {
	switch string(k) {
	case "event_id":
		return &ev.EventID, 1 << 8
	case "user_id":
		return &ev.UserID, 1 << 9
	case "country":
		return &ev.Country, 1 << 10
	case "os":
		return &ev.OS, 1 << 11
	case "device":
		return &ev.Device, 1 << 12
	case "source_stream":
		return &ev.SourceStream, 1 << 13
	}
	return nil, 0
}
