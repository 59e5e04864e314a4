// Profile, calendar feeds: a Copy button next to each feed URL (without JavaScript the fields stay
// selectable and copyable by hand), and focusing a URL selects all of it.
"use strict";

(function () {
  const status = document.getElementById("feeds-copied");

  function say(text) {
    status.textContent = "";
    window.setTimeout(() => { status.textContent = text; }, 50);
  }

  document.querySelectorAll(".feed-url").forEach((input) => {
    input.addEventListener("focus", () => input.select());
  });

  document.querySelectorAll("button.copy[data-copy]").forEach((button) => {
    const input = document.getElementById(button.dataset.copy);
    button.hidden = false;
    button.addEventListener("click", async () => {
      input.select();
      try {
        await navigator.clipboard.writeText(input.value);
      } catch (error) {
        if (!document.execCommand("copy")) {
          say("Could not copy: the URL is selected, press Ctrl+C (⌘C).");
          return;
        }
      }
      button.textContent = "Copied";
      say("URL copied.");
      window.setTimeout(() => { button.textContent = "Copy"; }, 2000);
    });
  });
})();
