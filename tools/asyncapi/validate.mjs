// Validates AsyncAPI documents with the AsyncAPI parser (the AsyncAPI CLI's own validator):
// the specification's schema, the Kafka bindings' schemas, $refs (relative files too) and the
// parser's recommended rules. Errors fail; warnings are printed. Usage: node validate.mjs FILE...
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { DiagnosticSeverity, Parser } from '@asyncapi/parser';

const parser = new Parser();
let failed = false;
for (const argument of process.argv.slice(2)) {
  const source = resolve(argument);
  const { document, diagnostics } = await parser.parse(await readFile(source, 'utf8'), { source });
  for (const diagnostic of diagnostics) {
    const severity = DiagnosticSeverity[diagnostic.severity].toLowerCase();
    console.log(`${argument}: ${severity}: ${diagnostic.path.join('.') || '/'}: ${diagnostic.message}`);
  }
  const errors = diagnostics.filter((d) => d.severity === DiagnosticSeverity.Error).length;
  if (document === undefined || errors > 0) {
    failed = true;
  } else {
    console.log(`${argument}: valid AsyncAPI ${document.version()}`);
  }
}
process.exit(failed ? 1 : 0);
