.PHONY: run test lint format bench

run:  ## set up everything and start the demo lab at http://127.0.0.1:8000
	scripts/run

test:  ## the whole test suite, on PostgreSQL and on SQLite
	scripts/test

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

bench:  ## booking throughput on PostgreSQL, then the agent (as root)
	DATABASE_URL=$${BENCH_DATABASE_URL:-postgres://portal:portal@127.0.0.1:5432/portal_bench} .venv/bin/python bench/booking.py
	.venv/bin/python bench/agent.py
