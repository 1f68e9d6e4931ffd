/** The SDK's name and version, as telemetry reports them (kept equal to package.json by a test). */
export const SDK_NAME = "tokenpace-web";
export const SDK_VERSION = "0.1.0";
