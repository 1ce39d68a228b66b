// Package docker is playpipe's end-to-end suite on real images, behind the
// "docker" build tag: Apache Kafka in KRaft mode and
// clickhouse/clickhouse-server, both at the versions docker-compose.yml uses
// and started with testcontainers-go; the roles (consume, report, sink) as
// separate processes of the binary built from this tree, configured through
// their environment as in a deployment; the partner API sandbox as the
// partner.
//
// TestPipelineOnContainers (pipeline_test.go) makes the assertions of
// demo/harness_test.go (a 500 storm, a standby window, a sink
// restart, a ClickHouse restart) plus a broker restart;
// TestMigrationsOnCurrentClickHouse (schema_test.go) checks, on
// docker-compose.yml's ClickHouse, that Migrate picks the current-server
// schema and is idempotent, and that the portable DDL runs there too. containers_test.go starts the containers,
// roles_test.go the roles as processes.
//
//	make e2e-docker        # cd e2e/docker && go test -tags docker -count=1 -v ./...
//
// It needs a Docker engine (DOCKER_HOST or the default socket). Without one
// the test fails saying so; it is not part of `make test`, which only
// compiles and vets it (make vet, make staticcheck).
//
// e2e/docker is a Go module of its own (go.mod, requiring playpipe through a
// replace directive to the repository's root), so testcontainers-go and the
// Docker client stay out of the module graph of a program that imports
// playpipe's libraries (producer's TestFleetModuleGraph).
package docker
