-- BIMI: a domain's logo (SVG text) and whether BIMI is enabled.
ALTER TABLE domains ADD COLUMN bimi_svg TEXT;
ALTER TABLE domains ADD COLUMN bimi_enabled BOOLEAN NOT NULL DEFAULT FALSE
