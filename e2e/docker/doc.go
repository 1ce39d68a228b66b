// Package docker is playpipe's end-to-end suite on real images, behind the
// "docker" build tag: Apache Kafka in KRaft mode and
// clickhouse/clickhouse-server, both at the versions docker-compose.yml uses
// and started with testcontainers-go; the roles (consume, report, sink) as
// separate processes of the binary built from this tree, configured through
// their environment as in a deployment; the partner API sandbox as the
// partner. It makes the assertions of pipeline/pipeline_test.go (a 500
// storm, a standby window, a sink restart, a ClickHouse restart) plus a
// broker restart.
//
//	make e2e-docker        # go test -tags docker -count=1 -v ./e2e/docker/
//
// It needs a Docker engine (DOCKER_HOST or the default socket). Without one
// the test fails saying so; it is not part of `make test`, which only
// compiles and vets it (go vet -tags docker ./...).
package docker
