module github.com/playpipe/playpipe/deploy/healthcheck

go 1.26.8
