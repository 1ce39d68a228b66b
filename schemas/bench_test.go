package schemas

import "testing"

func BenchmarkParseEvent(b *testing.B) {
	cases := map[string][]byte{
		"valid":      []byte(`{"event_id":"sim1-dev-00042-17","mix_id":102,"started_at":1704067200000,"offset_ms":300000,"duration_ms":184233,"user_id":"user-00031","country":"DE","os":"Android 14","device":"phone","vendor":2,"cached":false,"jump_forward":true,"end_reason":5}`),
		"wrong_type": []byte(`{"event_id":"e","mix_id":"102","started_at":1704067200000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":2}`),
		"malformed":  []byte(`{"event_id":"e","mix_id":102,"started_at":17040`),
	}
	for name, raw := range cases {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for i := 0; i < b.N; i++ {
				ParseEvent(raw, ValidateOptions{})
			}
		})
	}
}
