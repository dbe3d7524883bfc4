-- finetwin's two database roles, run once by an administrator on an empty database (psql 15 or later):
--   psql "$ADMIN_URL" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
-- The compose file runs it from PostgreSQL's /docker-entrypoint-initdb.d on the first start.
--
--   owner   (default finetwin_owner) owns the database and its schema; `finetwin migrate` runs as it.
--   service (default finetwin_app)   is what `finetwin ingest`, `api` and `relay` connect as: it reads and
--            writes the tables the owner creates, but owns nothing, so it cannot drop or alter a table or
--            disable a trigger; on the audit log it may only INSERT and SELECT (migration 0005 takes back
--            anything more), and the log's triggers refuse UPDATE, DELETE and TRUNCATE.
--
-- Passwords come from the environment (FINETWIN_OWNER_PASSWORD, FINETWIN_SERVICE_PASSWORD); the role
-- names may be changed with `-v owner=... -v service=...`.
\set ON_ERROR_STOP on
\if :{?owner}
\else
  \set owner finetwin_owner
\endif
\if :{?service}
\else
  \set service finetwin_app
\endif
\getenv owner_password FINETWIN_OWNER_PASSWORD
\getenv service_password FINETWIN_SERVICE_PASSWORD
\if :{?owner_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'set FINETWIN_OWNER_PASSWORD (the owner role''s password)'; END $$;
\endif
\if :{?service_password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'set FINETWIN_SERVICE_PASSWORD (the service role''s password)'; END $$;
\endif

CREATE ROLE :"owner" LOGIN PASSWORD :'owner_password';
CREATE ROLE :"service" LOGIN PASSWORD :'service_password';

-- The owner owns the database and the schema the tables go in; nobody else may create anything there.
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'owner') \gexec
ALTER SCHEMA public OWNER TO :"owner";
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON DATABASE :"DBNAME" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"DBNAME" TO :"service";
GRANT USAGE ON SCHEMA public TO :"service";

-- Every table and sequence the owner's migrations create: the service reads and writes rows, nothing more.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"service";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"service";
