// `import p from "x.safetensors" with { type: "file" }`: Bun gives the file's path (embedded in a compiled binary).
declare module "*.safetensors" {
  const path: string;
  export default path;
}
