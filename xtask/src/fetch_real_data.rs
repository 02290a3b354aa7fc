//! `cargo xtask fetch-real-data [--dir DIR]`: downloads the public real routing that the docs use
//! (the files of `../shared/data/real/`, from their authors' repositories at pinned commits),
//! verifies each file's SHA-256, and prints the commands that reproduce the docs' tables from it.
//!
//! Files go into a directory outside the repository (default `../moe-offload-real-data`, beside
//! the checkout) with the layout of `shared/data/real`, so `MOE_OFFLOAD_REAL_DATA=DIR` works for
//! the real-data tests too. Downloads use `curl` (present on every developer machine and CI image
//! we know; no HTTP client crate in xtask): each file is written to `NAME.part`, checked, then
//! renamed, so an interrupted run leaves no half file under the real name, and a file already
//! present with the right hash is not fetched again.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where each source repository's files come from, and where they go.
struct Source {
    /// Key used in [`TABLE`].
    key: &'static str,
    /// GitHub `owner/name`.
    repo: &'static str,
    /// The pinned commit.
    commit: &'static str,
    /// Directory under the output directory (as in `shared/data/real`).
    dir: &'static str,
    /// Keep the repository path under `dir` (else only the file name).
    keep_path: bool,
}

const SOURCES: [Source; 4] = [
    Source {
        key: "esft",
        repo: "deepseek-ai/ESFT",
        commit: "579a7711e4b332b4c57b47e378a0cf240d85caa6",
        dir: "esft-dsv2lite",
        keep_path: true,
    },
    Source {
        key: "vllm",
        repo: "weiran0129/vLLM-MoE-Logger",
        commit: "2c3c87c10e045aea0c495044d9b4f94cf16675b2",
        dir: "vllm-routelog-qwen15moe",
        keep_path: false,
    },
    Source {
        key: "mixtral",
        repo: "Mario928/speculative-moe",
        commit: "216e26eb86ee09fa46bb0e8c000be7e9758e10b6",
        dir: "mixtral-decode",
        keep_path: false,
    },
    Source {
        key: "reap",
        repo: "0xSero/dsv4-reap-routing",
        commit: "813981abcf0314feddf0f0583f54be035d72da47",
        dir: "reap-agg-dsv4",
        keep_path: false,
    },
];

/// The files the docs and the real-data tests use: source key, path in the repository, SHA-256.
/// Copied from `shared/data/real/PROVENANCE.tsv` (its `expert_configs`, `summary.json` and
/// `gsm8k_2_outputs.jsonl` rows are left out: nothing reads them).
const TABLE: &str = "\
esft\tresults/expert_scores/intent/expert_weights_1.txt\t3d5d33491b4e9493ced789e530984ffb81a3e301bd11fff0b32aa4046e422206\n\
esft\tresults/expert_scores/intent/expert_weights_10.txt\tb36b72f542d24ea9b0711f56df2084446b949fe03e0eb9798406e3b4ff941fc1\n\
esft\tresults/expert_scores/intent/expert_weights_11.txt\t71b9d16a1fba861a5f2d7d6ce9f29af6e1633d6fd9a9cda899341aade4d83363\n\
esft\tresults/expert_scores/intent/expert_weights_12.txt\tb51c04cd0f38946b601dd8c67a0f7bc062e19a2ff0332872608baba968e424ad\n\
esft\tresults/expert_scores/intent/expert_weights_13.txt\t32a9c782dd5b188b5e06c0b946fe3ba3b94662fe027a8bf24aa8ec6fd4bd81a8\n\
esft\tresults/expert_scores/intent/expert_weights_14.txt\t1eecc542e5c3fee97e824903407f68bbcf2dc85b50e7391d122865faa43c89ee\n\
esft\tresults/expert_scores/intent/expert_weights_15.txt\t29311624040116855b80d7a676ff2a09d39533a6b7188fb4e9335ea41592ccb9\n\
esft\tresults/expert_scores/intent/expert_weights_16.txt\tc1875e5f10b9f0f7ce109ce316d5803409ff6a398a62dfcd13cab72453f135cb\n\
esft\tresults/expert_scores/intent/expert_weights_17.txt\tceb06aabaab4c2857c3e48d9effe29abcc0f724f0b83df6de30587e6aa644928\n\
esft\tresults/expert_scores/intent/expert_weights_18.txt\t425e09d7887390c63ab1ebc16ae631c4ecc9ee05a68bdf0f2f6309e4fce011c7\n\
esft\tresults/expert_scores/intent/expert_weights_19.txt\td7167940f30f2797f35fefdfbc6894f49ddbbd4fd76f4e1ab7dae45f5c87a589\n\
esft\tresults/expert_scores/intent/expert_weights_2.txt\t98b3597f0ff265c62e2e429f1e99d8a32171afbc6b681a3a1cb56688256decc6\n\
esft\tresults/expert_scores/intent/expert_weights_20.txt\t0ec4da0b5cbf57368ce7e0fce8026a3c11ef988298457554c6546a9fb3f23357\n\
esft\tresults/expert_scores/intent/expert_weights_21.txt\t0b2e9b2913fd2fbd01f089fbdc6cc8d8734bc7d9b68d9b52f1fe5f074927263e\n\
esft\tresults/expert_scores/intent/expert_weights_22.txt\t3f5936a41538e713055f5dfd98c215d19f4c5414f860e7f178f9af50ecd53039\n\
esft\tresults/expert_scores/intent/expert_weights_23.txt\t0ccb77204a1fe43dd4b08f5d8a258438b17c2c679b830a2d1b412671a5709a2e\n\
esft\tresults/expert_scores/intent/expert_weights_24.txt\t474090e1d419e92ed5a7703d0b435d84aa2f193ba243ef4230aa69b324a433fd\n\
esft\tresults/expert_scores/intent/expert_weights_25.txt\t548c32e87991f64e92f828258ff5a8fb6a78b51b8132b994211922d3b3cc9fb0\n\
esft\tresults/expert_scores/intent/expert_weights_26.txt\t92947463645474d0417f069715bcb2eef84084e87e5aa1d691f47aba7adfdf07\n\
esft\tresults/expert_scores/intent/expert_weights_3.txt\te5196e7b1b69fdce7c3507061a1c2023175ec814b72af9a234d9e47c02c3c06e\n\
esft\tresults/expert_scores/intent/expert_weights_4.txt\tf1b7d3eca63eee6ad4b99b98ae870ba6ecba0f67b835f5229790be2e81c2809b\n\
esft\tresults/expert_scores/intent/expert_weights_5.txt\t953983e138146db721bd30dcc728b96998c3cb27919943fcff49088bfe718223\n\
esft\tresults/expert_scores/intent/expert_weights_6.txt\tc12dd6f1206f084ba5eed887c468f27be8e7c23c81bb893658692a2bc19e2655\n\
esft\tresults/expert_scores/intent/expert_weights_7.txt\t3bc116341ed6c041da5af5b77a94b1c759dac230f9789d557d19c44eebdc0941\n\
esft\tresults/expert_scores/intent/expert_weights_8.txt\t6811193087bb042ccccebc8f28e71700283ab6c2c29a8b70e8db15cdc11593fe\n\
esft\tresults/expert_scores/intent/expert_weights_9.txt\t8cf98a3b62d95c1e6898e905d0f30e03eb9aef78b487051aa72b05f49e235c69\n\
esft\tresults/expert_scores/law/expert_weights_1.txt\tc40453a24a4b3924a81ea0100f4ec42c966ad44b5496ec09b0083020d8169984\n\
esft\tresults/expert_scores/law/expert_weights_10.txt\ta802b365a383d9f0707415e7ab77309a4c99bd54d4ca1ed135092f5a240c46c6\n\
esft\tresults/expert_scores/law/expert_weights_11.txt\t5f5bec4e59ea8a9e9d0a46e9646604430be079804e28db234fd717b1a6488e93\n\
esft\tresults/expert_scores/law/expert_weights_12.txt\t36e4474735a0fca40e1931427089938ab3ab814b4de6cc86ab06605bf587f924\n\
esft\tresults/expert_scores/law/expert_weights_13.txt\t9652ed2c937ed8796aa3df8c57b6f0b41e7644ed2bb53a997a46084a6be7d704\n\
esft\tresults/expert_scores/law/expert_weights_14.txt\t904561bab8678e5436d81b30f3c74bacf965e476ae056ddda2d9a469d04fed1f\n\
esft\tresults/expert_scores/law/expert_weights_15.txt\t4da928e20c33807745d343db6db6449e043fe0869eb2d903fd9f45bdd142890e\n\
esft\tresults/expert_scores/law/expert_weights_16.txt\t86d5b501d181208afc314368c49ea5d273bbc9b0434786098f340ae15d990748\n\
esft\tresults/expert_scores/law/expert_weights_17.txt\t3d7e729fc5f5cce2363585727a7845cc5b066093b8ac6be578a2fe6877dabc99\n\
esft\tresults/expert_scores/law/expert_weights_18.txt\t22045b2c67b25ef6933f474ed8eef4d6ada11ea58a2e6c67f1a12393738673d6\n\
esft\tresults/expert_scores/law/expert_weights_19.txt\t0611ec1b268c29fc8d74763292c471e796159099a9a67ba684bc5925f64a2087\n\
esft\tresults/expert_scores/law/expert_weights_2.txt\ta0fd378be83c8b56c3385e44d3ea2edd7ea60ae89c5dd0fa932daa01fb93287e\n\
esft\tresults/expert_scores/law/expert_weights_20.txt\t684e82aa50ed239f87b4f5101a317ea963582f05b0f7030000f2d509c6d7d52a\n\
esft\tresults/expert_scores/law/expert_weights_21.txt\tb74986889472577c8c2084d13fac371e94cd7e17dd5189d7c73d471184a14aa2\n\
esft\tresults/expert_scores/law/expert_weights_22.txt\tab6e9316283a5d8d42fe12412444d93494c3315a054893aed31592f706da7bd9\n\
esft\tresults/expert_scores/law/expert_weights_23.txt\t5fcfb026d2f0ad5385dda9004bc0790f346b9f7a5c4a34b4387475817860d649\n\
esft\tresults/expert_scores/law/expert_weights_24.txt\te4a1bfb552a1fc72339fb921cf42b570d28688ab80905ba56821565de3462cb8\n\
esft\tresults/expert_scores/law/expert_weights_25.txt\tdca1f93884cdf3afeb449728506776dd6a1a3c35e9a3d1d3911c8e46e8e81407\n\
esft\tresults/expert_scores/law/expert_weights_26.txt\t941729fce9f9608f2196fde5c5a75a3d2c09ff7f121d55683f87647e2752fe45\n\
esft\tresults/expert_scores/law/expert_weights_3.txt\t027262c99aa17af80c4e9840d18ff84f590ea32fb5f76ff09e22de990b987b70\n\
esft\tresults/expert_scores/law/expert_weights_4.txt\t6cc9920c6148e3b0886e86f0fa75244f063f8f29531b5b675b7944972b2f3cfd\n\
esft\tresults/expert_scores/law/expert_weights_5.txt\tf70aaa9068655e68f0148e908ccb244a4ebbe8136d29e10962ca30446b8e2b7f\n\
esft\tresults/expert_scores/law/expert_weights_6.txt\t5cdf77be597cdc7f6456cb4f30dfb659068aa2ace95d3d66e2dca3f73ca0922d\n\
esft\tresults/expert_scores/law/expert_weights_7.txt\tc9090f71afd362cebf03d9b629be236feb7974849b8562ad3a93b5705125ec9c\n\
esft\tresults/expert_scores/law/expert_weights_8.txt\td7677cb3194ee42a1adc9056655050e7f6bd8f5eb8455613f4cb05735f91cbf6\n\
esft\tresults/expert_scores/law/expert_weights_9.txt\t9eec4aa58b70ed6b82a16473a50277c2d7767801f395ac6c2acf38ace8fde198\n\
esft\tresults/expert_scores/summary/expert_weights_1.txt\tb389da68afa33ed54f552a63dc420e20497b29d472012a32c5076a9cbac38c4a\n\
esft\tresults/expert_scores/summary/expert_weights_10.txt\td05fe659a10bebb5252d542c652755338e3577c9ae115d4d1f2740033da8d9a8\n\
esft\tresults/expert_scores/summary/expert_weights_11.txt\t3ff230c8d6ad8f9ff9e5b8b152180ebc5f7b838f2a56b1092da70f585e56586f\n\
esft\tresults/expert_scores/summary/expert_weights_12.txt\tdd56608e3919658bb55bd49db32c5cdee87f8deacdd1cc5eb0e423b17a86a2be\n\
esft\tresults/expert_scores/summary/expert_weights_13.txt\t63388a3b77a0307dbeeb286fc6897d468bb55d7482a607daff5f3a6b1e6ef1e0\n\
esft\tresults/expert_scores/summary/expert_weights_14.txt\tabf441c0aaeb3f0beba87ef787fa64fa4c9ab19b3e57de7a924589a97241f597\n\
esft\tresults/expert_scores/summary/expert_weights_15.txt\tb45aab78dc920a21c208d90dfe6ef5043279765035cb4b9157c4cdbcd9186b1f\n\
esft\tresults/expert_scores/summary/expert_weights_16.txt\t3db6d065a0dc49e34b9d0626c4a81568b391b41c5d5c45794ac22f73e830276a\n\
esft\tresults/expert_scores/summary/expert_weights_17.txt\t4a82bce1da05bbb432cbf89be1c207540f4745c2ae246d68d6de11bd41dbae98\n\
esft\tresults/expert_scores/summary/expert_weights_18.txt\t24521a746ee097213a5f3eb2877af4fceda722b1758fc72f2f9bab55d56db922\n\
esft\tresults/expert_scores/summary/expert_weights_19.txt\te34a102f2ba935c42a3e2e85c8657c68f83f3b8a174ee2d23824695108461b42\n\
esft\tresults/expert_scores/summary/expert_weights_2.txt\t64fec2bc4821bc5e3ccbf68b85f9bafde5c1559e20f6232dd8e023112d571c02\n\
esft\tresults/expert_scores/summary/expert_weights_20.txt\t15bf31a3c11ec4e4545e63843a0247e02ea8c6a6c1d6b81c988275fc5a516450\n\
esft\tresults/expert_scores/summary/expert_weights_21.txt\t372b7194b8dce586899bc568b144e89babe6ec7bfdaa34842fbc9c6a7ca01146\n\
esft\tresults/expert_scores/summary/expert_weights_22.txt\t7cad19bbe1af08a8a96e90b6549d747872d2a233f582442eea7b2cae0c99cba1\n\
esft\tresults/expert_scores/summary/expert_weights_23.txt\t9042225e378958bbb13000119734d3a161fb4c21b92b01681f85abe1470aebe5\n\
esft\tresults/expert_scores/summary/expert_weights_24.txt\t94e4949474969a6f3a3070402e3cbf614ee8b793f621e36680ed794b1e7ddd07\n\
esft\tresults/expert_scores/summary/expert_weights_25.txt\t95a7e774186de6ac3c2315c6657a23e1457a1dd4c55ef00f90648a2be7b7fcb5\n\
esft\tresults/expert_scores/summary/expert_weights_26.txt\t9dd566118a4d9393bfabdfa1b7f55063e7ab138bdcb18934562346148e3b7b16\n\
esft\tresults/expert_scores/summary/expert_weights_3.txt\t073ab5e04977d1b42e260888223755e35ab57d42b064c38ac921562e0ea893ef\n\
esft\tresults/expert_scores/summary/expert_weights_4.txt\t464e5cdef04390ec4a77172d30395e84c1fe60a583bd4b9017959776831036c5\n\
esft\tresults/expert_scores/summary/expert_weights_5.txt\t216a1bcd1aa8d78d6baca5b30809eb9cba1750ff77c98e6cce70cc701654c4cb\n\
esft\tresults/expert_scores/summary/expert_weights_6.txt\td2fd334f444bfb3358d1e4ac46258546a035390d1eff653d96c69e624adb34b5\n\
esft\tresults/expert_scores/summary/expert_weights_7.txt\t11b3636ac6e210c48017813f34a7e5b84fbd1fb3ae69d17d6cb277b58e8e6eb9\n\
esft\tresults/expert_scores/summary/expert_weights_8.txt\t052a75726723a050b900ef0f195553c69a769a97785292564248e5c72a00bd2c\n\
esft\tresults/expert_scores/summary/expert_weights_9.txt\t57a9a4a7a68fea0bf93aaca40ef0981ac8cf7556e1dcde926da3ed9dd4a06153\n\
esft\tresults/expert_scores/translation/expert_weights_1.txt\t902d5a2922670fa7198424bd5a93e956620aa1178d59e9c3c79a8e49a4f7e05b\n\
esft\tresults/expert_scores/translation/expert_weights_10.txt\taa53b5f81ae8bda67254897e8a9c8b4c2e2e7f860e418a48d290ba2501c4106a\n\
esft\tresults/expert_scores/translation/expert_weights_11.txt\tdfa1b4976bd257fe00fea1eb365b1a4d25977ba0ed9675f22429e9be3986da29\n\
esft\tresults/expert_scores/translation/expert_weights_12.txt\tacd623910bcab1ce4383c01e93338606f3430028edc68f25d9b133716c73c3b4\n\
esft\tresults/expert_scores/translation/expert_weights_13.txt\t3aabecd5e1e37e0134b90575d61ba457afd39b8b7450bd5ca88919097f92da65\n\
esft\tresults/expert_scores/translation/expert_weights_14.txt\tf63824f67971a90ecdc5789eede2ec93ea269533390e0f364def1de2ca3c1069\n\
esft\tresults/expert_scores/translation/expert_weights_15.txt\tf8584171d1c94d0add32af86718d917eb639f407b6651d327cee0051a6066984\n\
esft\tresults/expert_scores/translation/expert_weights_16.txt\t2e7d81a55cb5c990b41f001a6126ae42f383d95ba62b03a36381daa87c0e6461\n\
esft\tresults/expert_scores/translation/expert_weights_17.txt\t2b84f57076488d3bf2d70c63e69261ff6ae67b65be3947d6d07b6f29f180c625\n\
esft\tresults/expert_scores/translation/expert_weights_18.txt\td8982791b4d0623fb734acdc13a4c0435e745307d7d987c908ccfea93daad6ae\n\
esft\tresults/expert_scores/translation/expert_weights_19.txt\t471f0720baf40283a40d6691d3890181e551911c950644e2c5c4799459350e70\n\
esft\tresults/expert_scores/translation/expert_weights_2.txt\tca0ab42b2aaab633324ab30d0e65f5d1f623c4e35b7ecd03aae6f649b103205f\n\
esft\tresults/expert_scores/translation/expert_weights_20.txt\t37e1b2e5f956352d3a83d0746a20809b19556d11609c72e3f5d7e20a296d2c85\n\
esft\tresults/expert_scores/translation/expert_weights_21.txt\tff2d970042565b64af81485ed6b5e0a48eb278b96ac2fec3f1f1613ba234b2fc\n\
esft\tresults/expert_scores/translation/expert_weights_22.txt\t8d8f326c6f88acd6a42ad971a99e1ad6c646b57ef92e9e7e3ce3d73944c15a78\n\
esft\tresults/expert_scores/translation/expert_weights_23.txt\td044bbcad519b0d377b4cd1a7c0e7874c3dcc56e3ac30217e7304e3008c8229c\n\
esft\tresults/expert_scores/translation/expert_weights_24.txt\tf783e7615653d1ab6559fa346b2341211833ef92fb0b05ec17988bf9fd3b7181\n\
esft\tresults/expert_scores/translation/expert_weights_25.txt\tf4cba606ac9ec344d2505684e8bdb7da5943abe1005fffd6dea102b74459d8bf\n\
esft\tresults/expert_scores/translation/expert_weights_26.txt\tf3415f30ec040453d5e21068d37db29cc9ea0f796c8c9be5de7a3b0a496bf51c\n\
esft\tresults/expert_scores/translation/expert_weights_3.txt\t6a880d637cbd220bb9a6da672dced19ab4b18aad9ce0f63b0e2eb8e377f685c5\n\
esft\tresults/expert_scores/translation/expert_weights_4.txt\t8de37984f71592d7c5b65289ff6d5bba3de1ae9d7875733bb1afa92a3105529c\n\
esft\tresults/expert_scores/translation/expert_weights_5.txt\tc8a1adefc4b23717718a4ba4a8b13f703fe8bf416ddbb9656ef112b43c751ce9\n\
esft\tresults/expert_scores/translation/expert_weights_6.txt\t6a369556fdeb261614773e3486c5b080e99b3e1317a68ca5a70b47189e21ccd8\n\
esft\tresults/expert_scores/translation/expert_weights_7.txt\t8b3b751d728e38af2dbfa8266bb859bbaf9ea7c0f435ae29d57f54317fd28cf7\n\
esft\tresults/expert_scores/translation/expert_weights_8.txt\te747574bd058f8fcda95b5043b30bbdb003391810b48d0bf5d0108a6ebbc0f2d\n\
esft\tresults/expert_scores/translation/expert_weights_9.txt\teb3743f08a24865bc2ebfc896123b1fa5ccd84e40c6b55c51442688314500211\n\
mixtral\trouting_data_collected/gsm8k_2_routing.jsonl\t1bb2e9f769561165e952b1372cfaa61c678d93fb3edf298c0b34bfe9eee13e3a\n\
reap\tanalysis_all/core_agg.json\tf3f591cb93b0203e7bf20c29222bae0258cd53341d330d848035bfac6a419414\n\
vllm\tLogs/moe_layer0.jsonl\td2f198e22025ca3176c8378f4bd3a89abd5155fc02f8d76facfed6a24b0c916a\n\
vllm\tLogs/moe_layer12.jsonl\tfea1b84dc8bacc244f95891388ea6b210c7579ca6fd26299c7d4a9f452828d19\n\
vllm\tLogs/moe_layer18.jsonl\tce8ac4e0de3a3731eeccf9c59aca3661980f9cab718133c7fa260eacb7cf0905\n\
vllm\tLogs/moe_layer23.jsonl\t9efb3a01ccc33923de9eb2298e7c255f34b813959806ad24c67a851b73b39e27\n\
vllm\tLogs/moe_layer8.jsonl\t3d58957a1d6c293916cf6be84966068b838163002fb9f6d09a0a93153f40a652\n";

/// The raw GitHub host the files are fetched from.
pub const RAW_BASE: &str = "https://raw.githubusercontent.com";

/// One file to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealFile {
    /// Path under the output directory (the `shared/data/real` layout).
    pub local: String,
    /// Download URL at the pinned commit.
    pub url: String,
    /// Expected SHA-256, lowercase hex.
    pub sha256: String,
}

/// Every file of [`TABLE`], with its URL under `base` (normally [`RAW_BASE`]).
pub fn files(base: &str) -> Vec<RealFile> {
    TABLE
        .lines()
        .map(|line| {
            let mut f = line.split('\t');
            let (key, path, sha) = (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""));
            let src = SOURCES.iter().find(|s| s.key == key).expect("every row names a source");
            let name = if src.keep_path { path } else { path.rsplit('/').next().unwrap_or(path) };
            RealFile {
                local: format!("{}/{name}", src.dir),
                url: format!("{}/{}/{}/{path}", base.trim_end_matches('/'), src.repo, src.commit),
                sha256: sha.to_string(),
            }
        })
        .collect()
}

/// Why a fetch stopped.
#[derive(Debug)]
pub enum FetchError {
    /// The host could not be reached (no network, DNS, firewall, timeout): curl's exit code.
    Offline {
        /// The URL that failed.
        url: String,
        /// curl's exit code.
        code: i32,
        /// curl's message (its stderr).
        message: String,
    },
    /// Anything else (curl missing, HTTP error, hash mismatch, I/O).
    Other(anyhow::Error),
}

/// curl exit codes that mean "could not reach the host" rather than "the host said no": could not
/// resolve proxy (5) or host (6), could not connect (7), timeout (28), TLS connect error (35),
/// network-level send/receive errors (55, 56).
fn is_offline_code(code: i32) -> bool {
    matches!(code, 5 | 6 | 7 | 28 | 35 | 55 | 56)
}

/// Downloads `url` to `dest` with curl. curl's own message (stderr) is kept for the error, not
/// printed: the caller says what failed in one sentence.
fn download(url: &str, dest: &Path) -> std::result::Result<(), FetchError> {
    let out = Command::new("curl")
        .args(["--fail", "--location", "--silent", "--show-error", "--connect-timeout", "15", "--max-time", "600"])
        .arg("--output")
        .arg(dest)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FetchError::Other(anyhow::anyhow!(
                "curl is not installed: install it (apt-get install -y curl) and run this again"
            )));
        }
        Err(e) => return Err(FetchError::Other(anyhow::Error::new(e).context("starting curl"))),
    };
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => Ok(()),
        Some(code) if is_offline_code(code) => Err(FetchError::Offline { url: url.into(), code, message }),
        Some(22) => Err(FetchError::Other(anyhow::anyhow!(
            "{url}: the server answered with an HTTP error ({message}); the pinned commit may have been removed: \
             open an issue with this URL"
        ))),
        code => Err(FetchError::Other(anyhow::anyhow!("{url}: curl failed (exit {code:?}: {message})"))),
    }
}

/// `Ok(true)` when `path` exists and hashes to `sha256`.
pub fn verified(path: &Path, sha256: &str) -> Result<bool> {
    if !path.is_file() {
        return Ok(false);
    }
    Ok(trace_io::sha256_file(path).with_context(|| format!("hashing {}", path.display()))? == sha256)
}

/// What [`fetch`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// Files already present with the right hash.
    pub present: usize,
    /// Files downloaded and verified.
    pub downloaded: usize,
}

/// Fetches every file into `dir` from `base`, verifying hashes; `log` gets one line per file. On
/// failure (offline, say) the directories this call created and left empty are removed again, so
/// a failed first fetch leaves no empty data directory that would look like a download.
pub fn fetch(dir: &Path, base: &str, log: &mut dyn FnMut(&str)) -> std::result::Result<Fetched, FetchError> {
    let mut created = Vec::new();
    let result = fetch_into(dir, base, log, &mut created);
    if result.is_err() {
        // Deepest first; `remove_dir` refuses a directory that is not empty.
        for d in created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
    result
}

/// [`fetch`], recording in `created` every directory it creates (parents before children).
fn fetch_into(
    dir: &Path,
    base: &str,
    log: &mut dyn FnMut(&str),
    created: &mut Vec<PathBuf>,
) -> std::result::Result<Fetched, FetchError> {
    let mut done = Fetched::default();
    for f in files(base) {
        let dest = dir.join(&f.local);
        if verified(&dest, &f.sha256).map_err(FetchError::Other)? {
            done.present += 1;
            continue;
        }
        let parent = dest.parent().expect("a file under dir");
        let missing: Vec<PathBuf> = parent
            .ancestors()
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        created.extend(missing.into_iter().rev());
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))
            .map_err(FetchError::Other)?;
        let part = dest.with_extension(format!(
            "{}.part",
            dest.extension().map(|e| e.to_string_lossy().to_string()).unwrap_or_default()
        ));
        let result = download(&f.url, &part);
        if let Err(e) = result {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        let got = trace_io::sha256_file(&part).with_context(|| format!("hashing {}", part.display()));
        let got = got.map_err(FetchError::Other)?;
        if got != f.sha256 {
            let _ = std::fs::remove_file(&part);
            return Err(FetchError::Other(anyhow::anyhow!(
                "{}: SHA-256 {got}, expected {} (the file at the pinned commit changed, or the download was \
                 corrupted): run again; if it persists, open an issue",
                f.url,
                f.sha256
            )));
        }
        std::fs::rename(&part, &dest)
            .with_context(|| format!("renaming {} to {}", part.display(), dest.display()))
            .map_err(FetchError::Other)?;
        done.downloaded += 1;
        log(&format!("fetched {} ({})", f.local, &f.sha256[..12]));
    }
    Ok(done)
}

/// The default directory: `moe-offload-real-data` beside the checkout.
pub fn default_dir() -> PathBuf {
    crate::workspace_root()
        .parent()
        .map_or_else(|| PathBuf::from("moe-offload-real-data"), |p| p.join("moe-offload-real-data"))
}

/// The commands that reproduce the docs' tables from the fetched data in `dir`.
pub fn reproduce_commands(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "\
# the real-data tests and the real-data audit
MOE_OFFLOAD_REAL_DATA={d} cargo test --workspace --release
MOE_OFFLOAD_REAL_DATA={d} cargo xtask audit

# README: ESFT (DeepSeek-V2-Lite), calibrate on three domains, hold out translation
cargo build --release -p cli && export PATH=\"${{CARGO_TARGET_DIR:-$PWD/target}}/release:$PATH\"
moe-offload import esft {d}/esft-dsv2lite --domains intent,law,summary -o esft-work/calib.safetensors
moe-offload import esft {d}/esft-dsv2lite --domains translation -o esft-work/translation.safetensors
moe-offload sweep data/grids/esft-translation.json -o esft-work/sweep
moe-offload report esft-work/sweep -o esft-work/report.html

# docs/saliency.md: REAP aggregates, calibrate on bible
AGG={d}/reap-agg-dsv4/core_agg.json
moe-offload stats --reap-agg $AGG --corpus bible -o bible.json
for c in quran bofm; do moe-offload stats --reap-agg $AGG --corpus $c --non-finite-reap mask -o $c.json; done
for c in gita analects; do moe-offload stats --reap-agg $AGG --corpus $c -o $c.json; done
for m in reap l2_sum frequency hybrid; do moe-offload keep bible.json --metric $m --k 128,160 -o maps/; done
for m in l2_sum frequency reap hybrid; do moe-offload keep bible.json --metric $m --budget 5504,6880 -o bmaps/; done
moe-offload retention maps/*.json --heldout quran.json

# docs/importers.md: vLLM route logs (Qwen1.5-MoE) and Mixtral decode routing
moe-offload import vllm-routelog {d}/vllm-routelog-qwen15moe/moe_layer*.jsonl --num-experts 60 -o qwen.safetensors
moe-offload import mixtral-jsonl {d}/mixtral-decode/gsm8k_2_routing.jsonl -o mixtral.safetensors
moe-offload inspect qwen.safetensors
"
    )
}

/// Runs `cargo xtask fetch-real-data`.
pub fn run(dir: Option<&Path>) -> Result<()> {
    let dir = dir.map_or_else(default_dir, Path::to_path_buf);
    let root = crate::workspace_root();
    let abs = if dir.is_absolute() { dir.clone() } else { std::env::current_dir()?.join(&dir) };
    let inside = |p: &Path| {
        p.ancestors().any(|a| a == root || a.canonicalize().is_ok_and(|c| Some(c) == root.canonicalize().ok()))
    };
    if inside(&abs) {
        bail!(
            "{} is inside the repository: real data is never stored in the repository; use --dir {}",
            dir.display(),
            default_dir().display()
        );
    }
    println!("fetching {} files into {}", files(RAW_BASE).len(), dir.display());
    match fetch(&dir, RAW_BASE, &mut |line| println!("{line}")) {
        Ok(done) => {
            println!(
                "{} files already present and verified, {} downloaded and verified\n",
                done.present, done.downloaded
            );
            println!("Reproduce the docs' tables (from the repository root):\n\n{}", reproduce_commands(&dir));
            Ok(())
        }
        Err(FetchError::Offline { url, code, message }) => bail!(
            "cannot reach GitHub (curl exit {code} fetching {url}: {message}): this machine looks offline. Files already \
             fetched into {} are kept and verified again on the next run. On a machine with internet access run \
             `cargo xtask fetch-real-data --dir DIR` and copy DIR here, or set MOE_OFFLOAD_REAL_DATA to an existing \
             copy (this project's CI uses ../shared/data/real)",
            dir.display()
        ),
        Err(FetchError::Other(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_needed_file_once_with_a_sha256() {
        let files = files(RAW_BASE);
        assert_eq!(files.len(), 111);
        let mut locals: Vec<&str> = files.iter().map(|f| f.local.as_str()).collect();
        locals.sort_unstable();
        locals.dedup();
        assert_eq!(locals.len(), files.len(), "a local path repeats");
        for f in &files {
            assert_eq!(f.sha256.len(), 64, "{}", f.local);
            assert!(f.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{}", f.local);
        }
        let count = |prefix: &str| files.iter().filter(|f| f.local.starts_with(prefix)).count();
        assert_eq!(count("esft-dsv2lite/results/expert_scores/"), 4 * 26);
        assert_eq!(count("vllm-routelog-qwen15moe/"), 5);
        assert_eq!(count("reap-agg-dsv4/core_agg.json"), 1);
        assert_eq!(count("mixtral-decode/gsm8k_2_routing.jsonl"), 1);
    }

    #[test]
    fn urls_are_raw_github_at_the_pinned_commit() {
        let files = files(RAW_BASE);
        let esft =
            files.iter().find(|f| f.local == "esft-dsv2lite/results/expert_scores/law/expert_weights_7.txt").unwrap();
        assert_eq!(
            esft.url,
            "https://raw.githubusercontent.com/deepseek-ai/ESFT/579a7711e4b332b4c57b47e378a0cf240d85caa6/results/expert_scores/law/expert_weights_7.txt"
        );
        let vllm = files.iter().find(|f| f.local == "vllm-routelog-qwen15moe/moe_layer8.jsonl").unwrap();
        assert_eq!(
            vllm.url,
            "https://raw.githubusercontent.com/weiran0129/vLLM-MoE-Logger/2c3c87c10e045aea0c495044d9b4f94cf16675b2/Logs/moe_layer8.jsonl"
        );
        let reap = files.iter().find(|f| f.local == "reap-agg-dsv4/core_agg.json").unwrap();
        assert!(reap.url.ends_with(
            "/0xSero/dsv4-reap-routing/813981abcf0314feddf0f0583f54be035d72da47/analysis_all/core_agg.json"
        ));
        assert!(super::files("http://example.test/")[0].url.starts_with("http://example.test/deepseek-ai/"));
    }

    #[test]
    fn sha_check_accepts_the_right_bytes_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.txt");
        assert!(!verified(&p, "00").unwrap(), "a missing file is not verified");
        std::fs::write(&p, b"abc").unwrap();
        // SHA-256 of "abc" (FIPS 180-2 test vector).
        assert!(verified(&p, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad").unwrap());
        assert!(!verified(&p, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ae").unwrap());
    }

    /// The offline path, on loopback: nothing listens on port 9 of 127.0.0.1, so curl cannot
    /// connect, exactly as on a machine without internet access.
    #[test]
    fn an_unreachable_host_is_reported_as_offline_and_leaves_no_partial_file() {
        if Command::new("curl").arg("--version").output().is_err() {
            eprintln!("skipping: curl is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("real");
        let err = fetch(&data, "http://127.0.0.1:9", &mut |_| {}).unwrap_err();
        // curl's message is kept for the error (not printed over the test output).
        assert!(matches!(&err, FetchError::Offline { code: 7, message, .. } if message.contains("(7)")), "{err:?}");
        // No partial file, and no empty directory that would pass for the data.
        assert!(!data.exists(), "{:?}", walk(dir.path()));
        assert!(dir.path().exists());
    }

    /// With every file already present (the shared real data), nothing is downloaded: every hash
    /// in the table matches the files CI uses.
    #[test]
    #[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
    fn the_table_matches_the_shared_real_data() {
        let real = real_data::dir();
        let done = fetch(&real, "http://127.0.0.1:9", &mut |_| {}).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(done, Fetched { present: 111, downloaded: 0 });
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn a_directory_inside_the_repository_is_refused() {
        let err = run(Some(&crate::workspace_root().join("target/real"))).unwrap_err();
        assert!(err.to_string().contains("inside the repository"), "{err}");
    }
}
