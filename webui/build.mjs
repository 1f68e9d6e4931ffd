// Bundles the pages into dist/: each page's script with the web SDK (from its source,
// ../sdk_web/src) and uPlot, plus the HTML, the styles, the icon and uPlot's stylesheet,
// and Swagger UI's script and stylesheet for /docs. The gateway serves dist/ at /demo,
// /dashboard, /docs and /webui/ (gateway/http/pages.py); nothing is fetched at run time.
import { copyFile, mkdir, rm } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const dist = here("./dist/");

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });
await build({
  entryPoints: [here("./src/demo.ts"), here("./src/dashboard.ts"), here("./src/docs.ts")],
  outdir: dist,
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  legalComments: "linked",
  logLevel: "warning",
});
for (const file of ["demo.html", "dashboard.html", "docs.html", "style.css", "favicon.svg"]) {
  await copyFile(here(`./src/${file}`), `${dist}${file}`);
}
await copyFile(here("./node_modules/uplot/dist/uPlot.min.css"), `${dist}uPlot.min.css`);
for (const file of ["swagger-ui-bundle.js", "swagger-ui-bundle.js.LICENSE.txt", "swagger-ui.css"]) {
  await copyFile(here(`./node_modules/swagger-ui-dist/${file}`), `${dist}${file}`);
}
await copyFile(here("./node_modules/swagger-ui-dist/NOTICE"), `${dist}swagger-ui.NOTICE`);
