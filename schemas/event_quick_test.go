package schemas

import "testing"

func TestParseEventQuick(t *testing.T) {
	ev, vs := ParseEvent([]byte(`{"event_id":"e1","mix_id":5,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"de","os":"iOS 17","device":"phone","vendor":3,"end_reason":0}`), ValidateOptions{})
	if vs != nil || ev.Country != "DE" || ev.EndReason == nil || *ev.EndReason != 0 || ev.SourceStream != "mix" {
		t.Fatalf("got %+v %v", ev, vs)
	}
	_, vs = ParseEvent([]byte(`{"event_id":"e1","mix_id":"5","started_at":1.5,"offset_ms":-1,"duration_ms":0,"country":"DEU","os":"","device":"d"}`), ValidateOptions{})
	t.Log(vs)
	if len(vs) != 8 {
		t.Fatalf("want 8 violations, got %d: %v", len(vs), vs)
	}
}
