// Bundles the pages into dist/: each page's script with the web SDK (from its source,
// ../sdk_web/src) and uPlot, plus the HTML, the styles, the icon and uPlot's stylesheet. The
// gateway serves dist/ at /demo, /dashboard and /webui/ (gateway/pages.py); nothing is
// fetched at run time.
import { copyFile, mkdir, rm } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const dist = here("./dist/");

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });
await build({
  entryPoints: [here("./src/demo.ts"), here("./src/dashboard.ts")],
  outdir: dist,
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  legalComments: "linked",
  logLevel: "warning",
});
for (const file of ["demo.html", "dashboard.html", "style.css", "favicon.svg"]) {
  await copyFile(here(`./src/${file}`), `${dist}${file}`);
}
await copyFile(here("./node_modules/uplot/dist/uPlot.min.css"), `${dist}uPlot.min.css`);
